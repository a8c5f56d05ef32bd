"""pytest configuration for the real-client compatibility suites (compat/).

The broker/ZooKeeper fixtures live in gregor_fixtures.py / gregor_harness.py so
that protocol-tests/ can share them.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gregor_fixtures import *  # noqa: E402,F401,F403
