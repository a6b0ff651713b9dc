-- Each console form carries a random `once` value; the first POST of it is
-- recorded here, so a browser's reload of a result page (which sends the same
-- form again) does not rotate, mint or create a second time. Rows end with
-- their session.
CREATE TABLE admin_form_submissions (
    session_hash CHAR(64) NOT NULL REFERENCES admin_sessions(id_hash) ON DELETE CASCADE,
    once         TEXT NOT NULL,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (session_hash, once)
);
