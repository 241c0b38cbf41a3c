// Hello, Keel: the agent keel.toml declares as `[agents.detective]`, prompted once.
#[tokio::main]
async fn main() -> Result<(), keel::Error> {
    let agent = keel::Agent::from_config("keel.toml", "detective")?;
    let text = agent.prompt("Assess release v2.1.0").await?;
    println!("{text}");
    Ok(())
}
