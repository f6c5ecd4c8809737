-- Access tokens (`turnstile token create`, `turnstile serve --tokens`):
-- each stands for one namespace; only the SHA-256 of its secret is kept.
-- PostgreSQL's migration 0023 makes the same table.
CREATE TABLE tokens (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    sha256      BLOB NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
) WITHOUT ROWID;
