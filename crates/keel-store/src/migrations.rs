//! The SQL stores' schema migrations, embedded in the binary and applied on open.
//!
//! Each is a `migrations/<backend>/NNNN_description.sql` file listed below, given to sqlx's
//! migrator exactly as its `migrate!` macro would give it (same version, description,
//! checksum and `-- no-transaction` rule), so databases migrated by earlier builds accept
//! these. Listing the files by hand instead of using the macro keeps sqlx's proc-macro
//! crate — and a second, host-side build of SQLite it pulls in — out of every build; a test
//! checks that the lists match the directories.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// A migration file: its name (`NNNN_description.sql`) and its text.
type MigrationFile = (&'static str, &'static str);

macro_rules! migration_files {
    ($dir:literal: $($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../migrations/", $dir, "/", $name)))),*]
    };
}

/// `migrations/sqlite`, in order.
pub(crate) const SQLITE: &[MigrationFile] = migration_files!("sqlite":
    "0001_event_log.sql",
    "0002_queue_one_job_per_message.sql",
    "0003_lighter_indexes.sql",
    "0004_summary_on_status_change.sql",
    "0005_eval_results.sql",
    "0006_serving.sql",
    "0007_run_index.sql",
    "0008_run_metrics.sql",
    "0009_threads_without_rowid.sql",
    "0010_event_body_without_columns.sql",
    "0011_queue_continuations.sql",
);

/// `migrations/postgres`, in order.
pub(crate) const POSTGRES: &[MigrationFile] = migration_files!("postgres":
    "0001_event_log.sql",
    "0002_append_group.sql",
    "0003_queue_one_job_per_message.sql",
    "0004_lighter_indexes.sql",
    "0005_eval_results.sql",
    "0006_serving.sql",
    "0007_run_index.sql",
    "0008_run_metrics.sql",
    "0009_append_group_linear.sql",
    "0010_queue_continuations.sql",
);

/// The migrator of one backend's files.
pub(crate) fn migrator(files: &[MigrationFile]) -> Migrator {
    Migrator::with_migrations(
        files
            .iter()
            .filter_map(|(name, sql)| migration(name, sql))
            .collect(),
    )
}

/// What sqlx's `migrate!` derives from a file: the version before the first `_`, the rest
/// of the name without `.sql` and with `_` as spaces as the description, a simple (not
/// reversible) migration, run outside a transaction when it starts `-- no-transaction`.
/// `None` for a name without a numeric version (the test below rejects such a list).
fn migration(name: &str, sql: &'static str) -> Option<Migration> {
    let (version, rest) = name.split_once('_')?;
    let version: i64 = version.parse().ok()?;
    let description = rest.strip_suffix(".sql")?.replace('_', " ");
    Some(Migration::new(
        version,
        Cow::Owned(description),
        MigrationType::Simple,
        sql.into_sql_str(),
        sql.starts_with("-- no-transaction"),
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn on_disk(dir: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(dir);
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_migration_file_is_listed_in_order_and_parses() {
        for (dir, files) in [("sqlite", SQLITE), ("postgres", POSTGRES)] {
            let listed: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
            assert_eq!(
                listed,
                on_disk(dir),
                "{dir}: list the new file in migrations.rs"
            );
            let migrator = migrator(files);
            assert_eq!(
                migrator.migrations.len(),
                files.len(),
                "{dir}: a name does not parse"
            );
            let versions: Vec<i64> = migrator.migrations.iter().map(|m| m.version).collect();
            let expected: Vec<i64> = (1..=files.len() as i64).collect();
            assert_eq!(versions, expected, "{dir}: versions are 1, 2, 3, …");
        }
    }

    /// The start of the checksums that builds using sqlx's `migrate!` macro recorded in
    /// `_sqlx_migrations` (read from such a database). Editing a migration that databases
    /// have applied makes every one of them refuse to open: add a new migration instead.
    const RECORDED: [(&str, &[MigrationFile], &[&str]); 2] = [
        (
            "sqlite",
            SQLITE,
            &[
                "806b9abf001cf0c2",
                "4c7be2294dcdc7ff",
                "152be70485a6e866",
                "41b3ff29ef7ee56c",
            ],
        ),
        (
            "postgres",
            POSTGRES,
            &[
                "38504415c4cdcc79",
                "385d2bee57be4fb5",
                "806328ad1c4e86e1",
                "152be70485a6e866",
            ],
        ),
    ];

    #[test]
    fn databases_migrated_by_earlier_builds_keep_their_checksums() {
        for (dir, files, recorded) in RECORDED {
            let migrator = migrator(files);
            for (migration, expected) in migrator.migrations.iter().zip(recorded) {
                let hex: String = migration.checksum[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                assert_eq!(&hex, expected, "{dir} migration {}", migration.version);
            }
        }
        let first = &migrator(SQLITE).migrations[0];
        assert_eq!(first.description, "event log");
        assert!(!first.no_tx);
    }
}
