//! Serves keel-a2a's in-memory test agent (`echo`) over A2A on 127.0.0.1, for trying the
//! router with curl or any A2A client (see docs/a2a.md):
//!
//! ```sh
//! cargo run -p keel-a2a --example echo_server -- 41242
//! curl -s http://127.0.0.1:41242/.well-known/agent-card.json
//! ```

use keel_a2a::testing::EchoBackend;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(41242);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let address = listener.local_addr()?;
    let app = keel_a2a::router(
        std::sync::Arc::new(EchoBackend::new()),
        format!("http://{address}"),
    )
    .build();
    println!("READY http://{address}");
    axum::serve(listener, app).await
}
