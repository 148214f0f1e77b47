//! `simulate`: replays traces through the placement policies offline (`simulator::cli`).
//! The program's policies are the registry built here.

fn main() -> anyhow::Result<()> {
    let registry = placement::Registry::standard();
    simulator::cli::main(registry)
}
