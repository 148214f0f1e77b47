//! `simulate`: replays traces through the placement policies offline (`simulator::cli`).
//! The program's policies are the registry built here.

fn main() -> anyhow::Result<()> {
    let registry = placement::Registry::standard();
    let registry = two_per_host_policy::register(registry);
    simulator::cli::main(registry)
}
