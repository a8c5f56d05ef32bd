//! Authentication on the request path: SASL's handshake and token exchange, and what a
//! connection may ask before it is authenticated.

use super::*;

/// SASL on the request path: what may be asked before authentication, the handshake and the
/// token exchange.
impl RequestPath {
    /// Before authentication only ApiVersions and the SASL requests are served; Kafka closes
    /// the connection on anything else. After a session expired, only a re-authentication.
    pub(super) fn check_authentication(&self, key: i16) -> Result<(), FrameError> {
        let auth = self.auth();
        let expired = auth.session_expiry.is_some_and(|at| Instant::now() >= at);
        let allowed = match &auth.state {
            AuthState::NotSasl => true,
            AuthState::Handshake if !auth.authenticated_once => {
                key == ApiKey::ApiVersions as i16 || key == ApiKey::SaslHandshake as i16
            }
            AuthState::Authenticated if expired => key == ApiKey::SaslHandshake as i16,
            AuthState::Authenticated => true,
            AuthState::Authenticate { .. } if !auth.authenticated_once => key == ApiKey::SaslAuthenticate as i16,
            // Re-authenticating: the old session serves until it expires.
            AuthState::Handshake | AuthState::Authenticate { .. } => {
                !expired || key == ApiKey::SaslAuthenticate as i16 || key == ApiKey::SaslHandshake as i16
            }
        };
        if allowed {
            return Ok(());
        }
        Err(FrameError::Authentication(if expired {
            format!("request with API key {key} after the SASL session expired (connections.max.reauth.ms)")
        } else {
            format!("request with API key {key} before SASL authentication completed")
        }))
    }

    pub(super) fn sasl_handshake(
        &self,
        version: i16,
        request: kafka_protocol::messages::SaslHandshakeRequest,
    ) -> kafka_protocol::messages::SaslHandshakeResponse {
        use kafka_protocol::messages::SaslHandshakeResponse;
        let Some(settings) = &self.security.sasl else {
            return SaslHandshakeResponse::default().with_error_code(ErrorCode::IllegalSaslState.code());
        };
        let mechanisms = settings.mechanisms.iter().map(|m| m.clone().into()).collect();
        let response = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
        let mechanism = request.mechanism.to_string();
        let mut auth = self.auth();
        let reauth = match auth.state {
            AuthState::Handshake => false,
            AuthState::Authenticated if version >= 1 => true,
            _ => {
                auth.close_after_response = Some("SaslHandshake out of order".into());
                return response.with_error_code(ErrorCode::IllegalSaslState.code());
            }
        };
        if reauth && auth.mechanism.as_deref() != Some(mechanism.as_str()) {
            auth.close_after_response = Some(format!("re-authentication with another mechanism ({mechanism})"));
            return response.with_error_code(ErrorCode::UnsupportedSaslMechanism.code());
        }
        match Exchange::start(settings, &mechanism) {
            None => {
                let shown: String = mechanism.chars().take(64).collect();
                auth.close_after_response = Some(format!("SaslHandshake for unsupported mechanism {shown:?}"));
                response.with_error_code(ErrorCode::UnsupportedSaslMechanism.code())
            }
            Some(exchange) => {
                auth.state = AuthState::Authenticate { exchange, raw: version == 0 };
                auth.mechanism = Some(mechanism);
                response
            }
        }
    }

    /// One token through the exchange; on success the connection's principal is set.
    /// Err: the reason authentication failed (for the log), after the configured delay.
    pub(super) async fn sasl_step(&self, token: &[u8], version: i16) -> Result<(Vec<u8>, i64), String> {
        let Some(settings) = &self.security.sasl else {
            return Err("SASL token on a listener without SASL".into());
        };
        let security = &self.components.security;
        let (outcome, mechanism) = {
            let mut auth = self.auth();
            let mechanism = auth.mechanism.clone().unwrap_or_default();
            let AuthState::Authenticate { exchange, .. } = &mut auth.state else {
                return Err("SaslAuthenticate out of order".into());
            };
            (exchange.step(token, settings, &security.scram, &security.decoy_key), mechanism)
        };
        let why = match outcome {
            TokenOutcome::Challenge(c) => return Ok((c, 0)),
            TokenOutcome::Success { principal, response } => {
                let mut auth = self.auth();
                if auth.authenticated_once && *auth.principal != principal {
                    format!("re-authentication as {principal}, not {}", auth.principal)
                } else {
                    let lifetime = security.max_reauth_ms;
                    auth.session_expiry =
                        (lifetime > 0).then(|| Instant::now() + std::time::Duration::from_millis(lifetime as u64));
                    if !auth.authenticated_once {
                        tracing::info!(%principal, %mechanism, "authenticated");
                    }
                    auth.state = AuthState::Authenticated;
                    auth.principal = Arc::new(principal);
                    auth.authenticated_once = true;
                    // SaslAuthenticate v0 has no session lifetime: such a client is closed at expiry.
                    return Ok((response, if version >= 1 { lifetime } else { 0 }));
                }
            }
            TokenOutcome::Failure(why) => why,
        };
        // Brute force gets no faster answer than the configured delay.
        tokio::time::sleep(security.failed_authentication_delay).await;
        Err(format!("SASL {mechanism} authentication failed: {why}"))
    }

    pub(super) async fn sasl_authenticate(
        &self,
        version: i16,
        request: kafka_protocol::messages::SaslAuthenticateRequest,
    ) -> kafka_protocol::messages::SaslAuthenticateResponse {
        use kafka_protocol::messages::SaslAuthenticateResponse;
        if self.security.sasl.is_none() {
            return SaslAuthenticateResponse::default()
                .with_error_code(ErrorCode::IllegalSaslState.code())
                .with_error_message(Some("SaslAuthenticate request received on a listener without SASL".into()));
        }
        match self.sasl_step(&request.auth_bytes, version).await {
            Ok((token, lifetime)) => {
                SaslAuthenticateResponse::default().with_auth_bytes(token.into()).with_session_lifetime_ms(lifetime)
            }
            Err(why) => {
                let mut auth = self.auth();
                let mechanism = auth.mechanism.clone().unwrap_or_default();
                let out_of_order = !matches!(auth.state, AuthState::Authenticate { .. });
                auth.close_after_response = Some(why);
                let (code, message) = if out_of_order {
                    (ErrorCode::IllegalSaslState.code(), "Unexpected SaslAuthenticate request".to_string())
                } else {
                    (ErrorCode::SaslAuthenticationFailed.code(), crate::security::sasl::failure_message(&mechanism))
                };
                auth.state = AuthState::Handshake;
                SaslAuthenticateResponse::default().with_error_code(code).with_error_message(Some(message.into()))
            }
        }
    }

    /// A bare token after SaslHandshake v0, answered with a bare token; a failure closes the
    /// connection without an answer, as Kafka does.
    pub(super) async fn raw_token(&self, frame: Bytes) -> Result<Bytes, FrameError> {
        let (token, _) = self.sasl_step(&frame, 0).await.map_err(FrameError::Authentication)?;
        let mut buf = BytesMut::with_capacity(token.len() + 4);
        buf.put_i32(token.len() as i32);
        buf.extend_from_slice(&token);
        Ok(buf.freeze())
    }
}
