#!/usr/bin/env bash
# The one command that tests dlock on a fresh Debian machine:
#
#     ./scripts/test.sh
#
# It installs what the tests need where it is missing (the servers are started privately by the
# tests themselves, on free ports, so nothing here touches a server you already run), then runs
# every test of the workspace with all features: unit, integration, UI (trybuild) and doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs Debian package $2 when command (or file) $1 is missing.
need() {
    if ! [ -e "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
        echo "test.sh: installing $2 (for $1)"
        if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
    fi
}

need redis-server redis-server
need redis-cli redis-tools   # creates the private Redis Cluster of tests/redis_cluster.rs
need openssl openssl         # certificates for the rediss:// test (feature redis-tls)

# MariaDB for the mysql tests: the server on 127.0.0.1:3306 when root can use it (as on the
# project's machines); otherwise install and start one, with a user of the tests' own.
mysql_answers() { mariadb --connect-timeout=3 -h127.0.0.1 -P3306 -u"$1" ${2:+-p"$2"} test -e 'SELECT 1' >/dev/null 2>&1; }
if [ -z "${DLOCK_MYSQL_URL:-}" ] && ! mysql_answers root; then
    need mariadb mariadb-client
    need mariadbd mariadb-server
    if ! mariadb-admin ping >/dev/null 2>&1; then
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
        start-stop-daemon --start --oknodo --background --exec "$(command -v mariadbd)" -- --user=mysql
        for _ in $(seq 60); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.5; done
    fi
    mariadb -uroot -e "CREATE DATABASE IF NOT EXISTS test;
        CREATE USER IF NOT EXISTS 'dlock'@'127.0.0.1' IDENTIFIED BY 'dlock';
        CREATE USER IF NOT EXISTS 'dlock'@'localhost' IDENTIFIED BY 'dlock';
        GRANT ALL ON test.* TO 'dlock'@'127.0.0.1';
        GRANT ALL ON test.* TO 'dlock'@'localhost';"
    export DLOCK_MYSQL_URL=mysql://dlock:dlock@127.0.0.1:3306/test
fi
# PostgreSQL for the postgres tests: the server on 127.0.0.1:5432 when it answers (as on the
# project's machines, user postgres with trust authentication); otherwise install and start
# Debian's, trusting local connections, with the database `test`.
if [ -z "${DLOCK_POSTGRES_URL:-}" ] && ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    need pg_isready postgresql-client
    need /usr/share/postgresql-common/pg_wrapper postgresql
    if ! pg_isready -q -h 127.0.0.1 -p 5432; then
        if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
        cluster=$(pg_lsclusters -h | awk 'NR == 1 { print $1 " " $2 }')
        if [ -z "$cluster" ]; then
            version=$(ls /usr/lib/postgresql | sort -n | tail -1)
            $sudo pg_createcluster "$version" main -- --auth=trust >/dev/null
            cluster="$version main"
        fi
        # Trust on loopback, so the tests' URL needs no password.
        $sudo sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' \
            "/etc/postgresql/${cluster/ //}/pg_hba.conf" 2>/dev/null || true
        $sudo pg_ctlcluster $cluster start || $sudo pg_ctlcluster $cluster reload
        for _ in $(seq 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
    fi
fi
if [ -z "${DLOCK_POSTGRES_URL:-}" ]; then
    [ "$(psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" = 1 ] \
        || psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test'
fi
need java default-jre-headless
need /usr/share/java/zookeeper.jar zookeeper
need faketime faketime       # the skewed-clock client of tests/faults/
need /usr/sbin/pgbouncer pgbouncer  # the PgBouncer tests of tests/postgres/pgbouncer.rs
need protoc protobuf-compiler  # the `etcd` feature's client generates its gRPC code with it
need etcd etcd-server        # the private etcd members of tests/etcd/ and tests/faults/

if cargo nextest --version >/dev/null 2>&1; then
    # The UI tests compile a crate against dlock with the in-memory store only: a fraction of
    # the build all features would make them repeat.
    cargo nextest run --workspace --all-features --no-fail-fast -E 'not package(dlock-ui-tests)'
    cargo nextest run -p dlock-ui-tests
else
    cargo test --workspace --all-features --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --all-features --doc
