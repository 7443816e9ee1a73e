//! oncely-sandbox: a stand-in for outside APIs.
