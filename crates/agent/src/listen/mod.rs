//! How the hub listens: HTTP/1.1 accept loops, plain and TLS, with graceful shutdown
//! ([`server`]), and what each port allows its clients: a connection cap sized from the
//! process's open-files limit, header-read and idle timeouts ([`slots`]). The request path
//! behind them is one function, `outpost_proxy::pipeline::Pipeline::handle`.

pub mod server;
pub mod slots;
