"""pytest configuration for the raw-socket protocol tests: reuse compat's harness."""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
sys.path.insert(0, os.path.join(os.path.dirname(_here), "compat"))

from gregor_fixtures import *  # noqa: E402,F401,F403
