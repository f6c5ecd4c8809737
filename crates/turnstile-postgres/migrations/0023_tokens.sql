-- Access tokens (`turnstile token create`, `turnstile serve --tokens`):
-- each stands for one namespace; only the SHA-256 of its secret is kept.
-- SQLite's migration 0023 makes the same table.
CREATE TABLE tokens (
    id          uuid PRIMARY KEY,
    namespace   text NOT NULL,
    sha256      bytea NOT NULL UNIQUE,
    created_at  bigint NOT NULL,
    revoked_at  bigint
);
