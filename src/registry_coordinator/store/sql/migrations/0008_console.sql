-- Registry Coordinator schema, version 8: the operator console's sign-ins and sessions.

-- A browser's sign-in in progress, between sending it to the issuer and its coming
-- back: taken (deleted) once when it comes back, so an authorization response is
-- never used twice. Keyed by the SHA-256 of the random value in the browser's login
-- cookie, never by the value itself, so what the table holds cannot be replayed as a
-- cookie.
CREATE TABLE console_logins (
    login_hash  bytea PRIMARY KEY CHECK (octet_length(login_hash) = 32),
    state       text NOT NULL,           -- the OAuth state sent, to match the one returned
    nonce       text NOT NULL,           -- the OpenID nonce sent, to match the ID token's
    verifier    text NOT NULL,           -- the PKCE code verifier
    return_to   text NOT NULL,           -- the console page to go back to once signed in
    expires_at  timestamptz NOT NULL
);
-- Expired sign-ins are purged by the statement that begins the next one.
CREATE INDEX console_logins_expiry ON console_logins (expires_at);

-- A signed-in browser: the bearer token the console acts with (the same as the API's,
-- under the same policies) and the CSRF token its forms carry. Keyed, as a login is,
-- by the SHA-256 of the session cookie's value.
CREATE TABLE console_sessions (
    session_hash  bytea PRIMARY KEY CHECK (octet_length(session_hash) = 32),
    access_token  text NOT NULL,
    csrf          text NOT NULL,
    subject       text NOT NULL,         -- who signed in, as the token names them
    expires_at    timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
-- Expired sessions are purged by the statement that opens the next one.
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
