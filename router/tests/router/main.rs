//! The router's integration tests, one module per area, in one test binary (one link, not one
//! per area, after a change).

mod cors;
mod http;
mod openapi;
mod stop_props;
