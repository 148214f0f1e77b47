//! `allocator`: serves one zone's placement over HTTP, with durable state (`allocator::cli`).
//! The program's policies are the registry built here.

fn main() -> anyhow::Result<()> {
    let registry = placement::Registry::standard();
    allocator::cli::main(registry)
}
