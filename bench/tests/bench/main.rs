//! `tessera-bench`'s integration tests in one test binary (one link, not one per file, after
//! a change).

mod fake_server;
mod tessera;
