//! Tests of the Messages API: the translation into chat, the message and its stream events
//! from pieces of output, the error shapes, and the routes over HTTP with the test playing
//! the batcher.

mod errors;
mod http;
mod request;
mod response;
mod stream;
