//! What SQL the browser runs. Guarantees:
//! - the query box runs exactly one statement, and only a query (`SELECT`,
//!   `WITH ... SELECT`, `VALUES`): `CREATE`, `SET`, `COPY`, `INSERT`,
//!   `EXPLAIN`, `SHOW`, `DROP`, several statements ... are refused before
//!   anything is planned ([`check_query`]); the plan is checked again by
//!   DataFusion's `SQLOptions` (no DDL such as `SELECT INTO`, no DML, no
//!   statements);
//! - a `WHERE` box holds one expression and nothing after it
//!   ([`check_where`]); sort keys are columns of the version, quoted;
//! - every local path a query's table functions read (`read_storage`,
//!   `read_parquet`, ..., a path or `file://` URI) lies under the root or an
//!   allowed dir once `..` and symlinks are resolved; such a path must be a
//!   literal. `file_from_url` is refused (it would name any local file).
//!   Object stores (`s3://`, `gs://`, `az://`, `http(s)://`, `memory://`)
//!   are read with the server's storage settings;
//! - every run has a row limit (the page, `LIMIT`/`OFFSET` given to the
//!   plan, so scans stop early) and a timeout (dropping the run cancels it).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use datafusion::arrow::array::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SQLOptions;
use datafusion::sql::parser::{DFParser, Statement as DfStatement};
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, ObjectName, Statement, TableFactor, Value, Visit, Visitor,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::session::Session;
use crate::util::redact::redact;

/// Table functions whose first argument is a URI or a local path: every
/// table function of scripts but `read_dataset` (a dataset's name), so a new
/// one is checked unless it is exempted here.
fn reads_a_path(name: &str) -> bool {
    name != "read_dataset" && crate::script::TABLE_FUNCTIONS.contains(&name)
}

/// URI schemes of object stores (not local paths).
const REMOTE_SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https", "memory",
];

/// Why a query is not run (shown on the page, redacted).
#[derive(Debug)]
pub(super) struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

/// Checks `sql` is one read-only query whose local reads stay in `allowed`.
pub(super) fn check_query(sql: &str, allowed: &[PathBuf]) -> Result<(), Refused> {
    let mut statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})
        .map_err(|e| Refused(format!("not valid SQL: {e}")))?;
    if statements.len() != 1 {
        return Err(Refused(format!(
            "one SELECT statement only, got {}",
            statements.len()
        )));
    }
    let Some(DfStatement::Statement(stmt)) = statements.pop_front() else {
        return Err(Refused(
            "only SELECT queries run here (no CREATE, COPY, EXPLAIN, RESET)".into(),
        ));
    };
    let Statement::Query(_) = stmt.as_ref() else {
        let first = stmt.to_string();
        let word = first.split_whitespace().next().unwrap_or("this statement");
        return Err(Refused(format!(
            "only SELECT queries run here, not {}",
            word.to_ascii_uppercase()
        )));
    };
    let mut check = Reads {
        allowed,
        refused: None,
    };
    let _ = stmt.visit(&mut check);
    match check.refused {
        Some(r) => Err(r),
        None => Ok(()),
    }
}

/// Checks a `WHERE` box holds one expression and nothing else.
pub(super) fn check_where(text: &str) -> Result<(), Refused> {
    let bad = |e: String| Refused(format!("the filter is not one SQL expression: {e}"));
    let mut parser = Parser::new(&GenericDialect {})
        .try_with_sql(text)
        .map_err(|e| bad(e.to_string()))?;
    parser.parse_expr().map_err(|e| bad(e.to_string()))?;
    match parser.peek_token().token {
        Token::EOF => Ok(()),
        t => Err(bad(format!("unexpected {t} after the expression"))),
    }
}

/// `name` as a SQL identifier.
pub(super) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as a SQL string literal.
pub(super) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Plans `sql` (already checked) with DDL, DML and statements refused.
pub(super) async fn plan(session: &Session, sql: &str) -> Result<DataFrame, Refused> {
    let options = SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false);
    session
        .context()
        .sql_with_options(sql, options)
        .await
        .map_err(|e| Refused(e.strip_backtrace()))
}

/// Rows `skip..skip + fetch` of `df`, within `timeout`.
pub(super) async fn rows(
    df: DataFrame,
    skip: usize,
    fetch: usize,
    timeout: Duration,
) -> Result<Vec<RecordBatch>, Refused> {
    let df = df
        .limit(skip, Some(fetch))
        .map_err(|e| Refused(e.strip_backtrace()))?;
    match tokio::time::timeout(timeout, df.collect()).await {
        Ok(r) => r.map_err(|e| Refused(e.strip_backtrace())),
        Err(_) => Err(Refused(format!(
            "the query ran over its timeout of {} s",
            timeout.as_secs_f64()
        ))),
    }
}

/// The rows of `df`, counted within `timeout`.
pub(super) async fn count(df: DataFrame, timeout: Duration) -> Result<usize, Refused> {
    match tokio::time::timeout(timeout, df.count()).await {
        Ok(r) => r.map_err(|e| Refused(e.strip_backtrace())),
        Err(_) => Err(Refused(format!(
            "counting ran over the timeout of {} s",
            timeout.as_secs_f64()
        ))),
    }
}

/// Finds local reads outside the allowed dirs and `file_from_url` calls.
struct Reads<'a> {
    allowed: &'a [PathBuf],
    refused: Option<Refused>,
}

impl Reads<'_> {
    fn table_function(&mut self, name: &ObjectName, args: &[FunctionArg]) -> ControlFlow<()> {
        let name = name.to_string().to_ascii_lowercase();
        let name = name.rsplit('.').next().unwrap_or(&name).trim_matches('"');
        if !reads_a_path(name) {
            return ControlFlow::Continue(());
        }
        let first = args.first().and_then(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        });
        let uri = match first {
            Some(Expr::Value(v)) => match &v.value {
                Value::SingleQuotedString(s) => Some(s.as_str()),
                _ => None,
            },
            _ => None,
        };
        let Some(uri) = uri else {
            self.refused = Some(Refused(format!("{name}: give its URI as a string literal")));
            return ControlFlow::Break(());
        };
        match local_path(uri) {
            None => ControlFlow::Continue(()),
            Some(path) if inside(&path, self.allowed) => ControlFlow::Continue(()),
            Some(_) => {
                self.refused = Some(Refused(format!(
                    "{name}('{uri}'): local paths must lie under the root or a dir given with --allow"
                )));
                ControlFlow::Break(())
            }
        }
    }
}

impl Visitor for Reads<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        match factor {
            TableFactor::Table {
                name,
                args: Some(args),
                ..
            } => self.table_function(name, &args.args),
            TableFactor::Function { name, args, .. } => self.table_function(name, args),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = expr {
            let name = f.name.to_string().to_ascii_lowercase();
            if name.trim_matches('"') == "file_from_url" {
                self.refused = Some(Refused(
                    "file_from_url is not available in the browser (it names any file)".into(),
                ));
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

/// The local path a URI names (`None` for an object store).
fn local_path(uri: &str) -> Option<PathBuf> {
    let scheme = uri.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some(s) if REMOTE_SCHEMES.contains(&s) => None,
        Some("file") => Some(
            url::Url::parse(uri)
                .ok()
                .and_then(|u| u.to_file_path().ok())
                .unwrap_or_else(|| PathBuf::from("/")),
        ),
        // Any other scheme: the engine refuses it; treat it as a path.
        _ => Some(PathBuf::from(uri)),
    }
}

/// Whether `path` (resolved: `..`, symlinks) lies under one of `allowed`
/// (canonical). A path that does not exist is judged by its longest existing
/// ancestor.
pub(super) fn inside(path: &Path, allowed: &[PathBuf]) -> bool {
    let Ok(abs) = std::path::absolute(path) else {
        return false;
    };
    let mut probe = abs.as_path();
    let mut rest = Vec::new();
    let resolved = loop {
        match std::fs::canonicalize(probe) {
            Ok(c) => break Some(c),
            Err(_) => match (probe.parent(), probe.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    probe = parent;
                }
                _ => break None,
            },
        }
    };
    let Some(mut resolved) = resolved else {
        return false;
    };
    for part in rest.iter().rev() {
        if part == ".." {
            return false;
        }
        resolved.push(part);
    }
    allowed.iter().any(|a| resolved.starts_with(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_select_passes() {
        let none: &[PathBuf] = &[];
        assert!(check_query("SELECT 1", none).is_ok());
        assert!(check_query("WITH t AS (SELECT 1 AS a) SELECT a FROM t", none).is_ok());
        for bad in [
            "CREATE TABLE t AS SELECT 1",
            "SET datafusion.execution.batch_size = 1",
            "COPY (SELECT 1) TO '/tmp/x.csv'",
            "INSERT INTO t VALUES (1)",
            "SELECT 1; SELECT 2",
            "EXPLAIN ANALYZE SELECT 1",
            "DROP TABLE t",
            "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/'",
            "SELECT file_from_url('file:///etc/passwd')",
            "SELECT * FROM read_storage('/etc/')",
            "SELECT * FROM read_csv('file:///etc/passwd')",
        ] {
            assert!(check_query(bad, none).is_err(), "{bad} passed");
        }
        assert!(check_query("SELECT * FROM read_storage('s3://b/x/')", none).is_ok());
    }

    #[test]
    fn a_filter_is_one_expression() {
        assert!(check_where("a > 1 AND b = 'x'").is_ok());
        assert!(check_where("a > 1; DROP TABLE t").is_err());
        assert!(check_where("a > 1) UNION (SELECT 1").is_err());
    }

    #[test]
    fn paths_stay_under_the_allowed_dirs() {
        let dir = tempfile::tempdir().expect("dir");
        let root = std::fs::canonicalize(dir.path()).expect("canon");
        let allowed = vec![root.clone()];
        assert!(inside(&root.join("a/b"), &allowed));
        assert!(!inside(&root.join("../x"), &allowed));
        assert!(!inside(&root.join("missing/../../x"), &allowed));
        assert!(!inside(Path::new("/etc/passwd"), &allowed));
    }
}
