//! The throwaway PostgreSQL cluster that the multi-agent store's tests run against: `scripts/setup.sh`
//! installs PostgreSQL, and a test starts a cluster of its own on a free loopback port, uses it
//! and removes it, also when it runs as root (the cluster then belongs to `postgres`).

use test_support::postgres::Postgres;

#[test]
fn a_throwaway_cluster_starts_answers_survives_an_outage_and_is_removed() {
    let mut pg = Postgres::start();
    assert_eq!(pg.psql("SELECT current_database() || ' ' || current_user"), "alloc alloc");
    pg.psql("CREATE TABLE t (x INT PRIMARY KEY); INSERT INTO t VALUES (1)");
    // An outage and its end: what was committed is still there on the same port.
    pg.stop();
    pg.restart();
    assert_eq!(pg.psql("SELECT count(*) FROM t"), "1");
    let dir = pg.data_dir();
    drop(pg);
    assert!(!dir.exists(), "the cluster's directory {} is removed", dir.display());
}
