//! Tessera router.
