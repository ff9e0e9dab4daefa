//! Statements of a script, recognised from the tokens of sqlparser's tokenizer
//! with the `GenericDialect` DataFusion parses with; the runner and the CLI both
//! use this module and nothing else to look at statement text.
//!
//! Guarantees:
//! - a `;` ends a statement only outside string literals, quoted identifiers and
//!   comments (`--`, `/* */`, nested); empty statements are skipped;
//! - keywords match case-insensitively with any whitespace or comments between
//!   them (`create  dataset`, `CREATE\t/* c */ DATASET`);
//! - a statement's text is the script's text exactly as written, from its first
//!   token to its last (comments inside kept), with the 1-based line and column
//!   (in characters) of its first token; the parts of udfchain's own statements
//!   (setting name and value, dataset name, the query of `CREATE DATASET`, the
//!   body of `EXPLAIN`) come from tokens, never from slicing by keyword length,
//!   and the query and the body carry their own positions;
//! - a script that cannot be tokenized (unterminated string, quoted identifier
//!   or comment) or a malformed `SET` / `CREATE DATASET` / `SHOW DATASETS` is an
//!   [`Error::Script`] with a line and column, before any statement runs; no
//!   input panics (property tests below).
//!
//! `/*! ... */` is an optimizer hint to the `GenericDialect`: its content is SQL
//! to this module as it is to DataFusion's parser.

use std::ops::Range;

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, Tokenizer};

use crate::error::{Error, Result};

/// One statement of a script (without its `;`), where it starts (1-based) and
/// what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The text exactly as written, from the first token to the last.
    pub text: String,
    /// Its first token's line (1-based).
    pub line: usize,
    /// Its first token's column (1-based).
    pub column: usize,
    /// What it is.
    pub kind: Kind,
}

/// What a statement is, with its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `SET name = value` or `SET name TO value`. `name` is a word or dotted
    /// words (`storage.region`); `value` is a quoted string's content, else the
    /// value's text as written (`16`, `auto`, `-1`).
    Set {
        /// The setting's name.
        name: String,
        /// Its value.
        value: String,
    },
    /// `CREATE DATASET name AS query`. `name` is a quoted identifier's content,
    /// else the name as written; `query` is the rest (its kind is always `Sql`).
    CreateDataset {
        /// The dataset's name.
        name: String,
        /// The query whose rows it saves.
        query: Box<Statement>,
    },
    /// `SHOW DATASETS`.
    ShowDatasets,
    /// `EXPLAIN [ANALYZE] [VERBOSE] body`; `body` is recognised as a
    /// `CREATE DATASET` (explained as its query) or else `Sql`.
    Explain {
        /// `ANALYZE`: run it and show the metrics.
        analyze: bool,
        /// `VERBOSE`.
        verbose: bool,
        /// What is explained.
        body: Box<Statement>,
    },
    /// Anything else: DataFusion's SQL.
    Sql,
}

/// Splits a script into its statements and recognises each.
pub fn split(script: &str) -> Result<Vec<Statement>> {
    Ok(statements(script)?.into_iter().map(|(_, s)| s).collect())
}

/// The statements with the byte range of each in `script`.
fn statements(script: &str) -> Result<Vec<(Range<usize>, Statement)>> {
    let toks = tokenize(script)?;
    let mut out = Vec::new();
    for group in toks.split(|t| t.token == Token::SemiColon) {
        let group = trim(group);
        if let (Some(first), Some(last)) = (group.first(), group.last()) {
            out.push((first.start..last.end, statement(script, group, true)?));
        }
    }
    Ok(out)
}

/// A token with its byte range in the script and where it starts.
#[derive(Debug)]
struct Tok {
    token: Token,
    start: usize,
    end: usize,
    line: usize,
    column: usize,
}

impl Tok {
    fn is_space(&self) -> bool {
        matches!(self.token, Token::Whitespace(_))
    }

    /// An unquoted word equal to `kw`, ignoring ASCII case.
    fn is_keyword(&self, kw: &str) -> bool {
        matches!(&self.token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(kw))
    }
}

fn tokenize(script: &str) -> Result<Vec<Tok>> {
    let dialect = GenericDialect {};
    let mut tokens = Vec::new();
    if let Err(e) = Tokenizer::new(&dialect, script).tokenize_with_location_into_buf(&mut tokens) {
        // Where the token that failed starts (the opening quote of an
        // unterminated string or comment), not where the input ran out.
        let at = tokens.last().map_or(Location::new(1, 1), |t| t.span.end);
        return Err(Error::Script {
            line: to_usize(at.line).max(1),
            column: to_usize(at.column).max(1),
            source: Box::new(Error::Syntax(lowercase_first(&e.message))),
        });
    }
    let mut at = Cursor::new(script);
    Ok(tokens
        .into_iter()
        .filter(|t| t.token != Token::EOF)
        .map(|t| {
            let start = at.offset(t.span.start);
            let end = at.offset(t.span.end).max(start);
            Tok {
                token: t.token,
                start,
                end,
                line: to_usize(t.span.start.line),
                column: to_usize(t.span.start.column),
            }
        })
        .collect())
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_lowercase().chain(c).collect())
        .unwrap_or_default()
}

/// Turns the tokenizer's (line, column) into byte offsets, moving forward for
/// increasing locations (linear in the script), back to a line start otherwise.
struct Cursor<'a> {
    script: &'a str,
    line_starts: Vec<usize>,
    line: usize,
    column: usize,
    byte: usize,
}

impl<'a> Cursor<'a> {
    fn new(script: &'a str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(script.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self {
            script,
            line_starts,
            line: 1,
            column: 1,
            byte: 0,
        }
    }

    fn offset(&mut self, loc: Location) -> usize {
        let (line, column) = (to_usize(loc.line), to_usize(loc.column));
        if line == 0 {
            return self.byte;
        }
        if (line, column) < (self.line, self.column) {
            let Some(&start) = self.line_starts.get(line - 1) else {
                return self.script.len();
            };
            (self.line, self.column, self.byte) = (line, 1, start);
        }
        while (self.line, self.column) < (line, column) {
            let Some(c) = self.script[self.byte..].chars().next() else {
                break;
            };
            self.byte += c.len_utf8();
            if c == '\n' {
                self.line += 1;
                self.column = 1;
            } else {
                self.column += 1;
            }
        }
        self.byte
    }
}

/// `toks` without leading and trailing whitespace and comments.
fn trim(toks: &[Tok]) -> &[Tok] {
    let start = toks
        .iter()
        .position(|t| !t.is_space())
        .unwrap_or(toks.len());
    let end = toks
        .iter()
        .rposition(|t| !t.is_space())
        .map_or(start, |i| i + 1);
    &toks[start..end.max(start)]
}

/// The script text of `toks` (trimmed, non-empty).
fn text_of(script: &str, toks: &[Tok]) -> String {
    match (toks.first(), toks.last()) {
        (Some(f), Some(l)) => script.get(f.start..l.end).unwrap_or_default().to_string(),
        _ => String::new(),
    }
}

/// A statement from its trimmed, non-empty tokens; `top`: a whole statement
/// of the script (else the body of an `EXPLAIN`, where only `CREATE DATASET`
/// is recognised, so nesting stops there).
fn statement(script: &str, toks: &[Tok], top: bool) -> Result<Statement> {
    let (line, column) = toks.first().map_or((1, 1), |t| (t.line, t.column));
    let kind = classify(script, toks, top).map_err(|e| match e {
        e @ Error::Script { .. } => e,
        e => Error::Script {
            line,
            column,
            source: Box::new(e),
        },
    })?;
    Ok(Statement {
        text: text_of(script, toks),
        line,
        column,
        kind,
    })
}

fn classify(script: &str, toks: &[Tok], top: bool) -> Result<Kind> {
    // Indices of the tokens that are not whitespace or comments.
    let sig: Vec<usize> = (0..toks.len()).filter(|&i| !toks[i].is_space()).collect();
    let kw = |i: usize, k: &str| sig.get(i).is_some_and(|&j| toks[j].is_keyword(k));
    // Tokens from the i-th to the j-th significant one, inclusive.
    let span = |i: usize, j: usize| &toks[sig[i]..=sig[j]];
    let last = sig.len().saturating_sub(1);
    let syntax = |m: &str| Error::Syntax(m.to_string());

    if top && kw(0, "SET") {
        let (name, eq) = setting_name(toks, &sig).ok_or_else(|| {
            syntax("SET needs a setting name such as `prefetch` or `storage.region`")
        })?;
        let is_eq = sig.get(eq).is_some_and(|&j| toks[j].token == Token::Eq);
        if !(is_eq || kw(eq, "TO")) || eq >= last {
            return Err(syntax("SET needs `name = value`"));
        }
        let value = one_value(script, span(eq + 1, last)).ok_or_else(|| {
            Error::Syntax(format!(
                "the value of {name} has spaces in it: quote it ('...')"
            ))
        })?;
        return Ok(Kind::Set { name, value });
    }
    if kw(0, "CREATE") && kw(1, "DATASET") {
        let usage = "CREATE DATASET needs `name AS query`";
        // The `AS` after the name: apart from it (a name such as `a-as` holds
        // the word `as`), unless the name is quoted.
        let apart = |i: usize| {
            toks[sig[i] - 1].is_space()
                || matches!(&toks[sig[i - 1]].token, Token::Word(w) if w.quote_style.is_some())
        };
        let as_ = (3..sig.len())
            .find(|&i| kw(i, "AS") && apart(i))
            .ok_or_else(|| syntax(usage))?;
        if as_ == last {
            return Err(syntax(usage));
        }
        let name = one_value(script, span(2, as_ - 1)).ok_or_else(|| {
            syntax("a dataset name is one word: quote it (\"...\") if it has spaces")
        })?;
        let query = span(as_ + 1, last);
        let (line, column) = (query[0].line, query[0].column);
        return Ok(Kind::CreateDataset {
            name,
            query: Box::new(Statement {
                text: text_of(script, query),
                line,
                column,
                kind: Kind::Sql,
            }),
        });
    }
    if top && kw(0, "SHOW") && kw(1, "DATASETS") {
        if sig.len() > 2 {
            return Err(syntax("SHOW DATASETS takes nothing after it"));
        }
        return Ok(Kind::ShowDatasets);
    }
    if top && kw(0, "EXPLAIN") {
        let (mut analyze, mut verbose, mut i) = (false, false, 1);
        loop {
            if kw(i, "ANALYZE") {
                analyze = true;
            } else if kw(i, "VERBOSE") {
                verbose = true;
            } else {
                break;
            }
            i += 1;
        }
        if i > last {
            return Ok(Kind::Sql);
        }
        let body = statement(script, span(i, last), false)?;
        return Ok(Kind::Explain {
            analyze,
            verbose,
            body: Box::new(body),
        });
    }
    Ok(Kind::Sql)
}

/// The name after `SET`: words joined by periods (spaces around them allowed,
/// as in SQL compound names: `prefetch`, `storage.region`, `"storage"."region"`;
/// a keyword such as `to` is a name here), with the index in `sig` of what
/// follows it.
fn setting_name(toks: &[Tok], sig: &[usize]) -> Option<(String, usize)> {
    let word = |i: usize| match sig.get(i).map(|&j| &toks[j].token) {
        Some(Token::Word(w)) => Some(w.value.as_str()),
        _ => None,
    };
    let mut name = word(1)?.to_string();
    let mut i = 2;
    while sig.get(i).is_some_and(|&j| toks[j].token == Token::Period) {
        name.push('.');
        name.push_str(word(i + 1)?);
        i += 2;
    }
    Some((name, i))
}

/// A value of one token or of tokens with nothing between them: a quoted
/// string's or identifier's content, else the text as written.
fn one_value(script: &str, toks: &[Tok]) -> Option<String> {
    match toks {
        [] => None,
        [t] => Some(match &t.token {
            Token::SingleQuotedString(s) => s.clone(),
            Token::Word(w) if w.quote_style.is_some() => w.value.clone(),
            _ => text_of(script, toks),
        }),
        _ if toks.iter().any(Tok::is_space) => None,
        _ => Some(text_of(script, toks)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(script: &str) -> Statement {
        let mut all = split(script).unwrap_or_else(|e| panic!("{script:?}: {e}"));
        assert_eq!(all.len(), 1, "{script:?}: {all:?}");
        all.remove(0)
    }

    fn sql(text: &str, line: usize, column: usize) -> Box<Statement> {
        Box::new(Statement {
            text: text.into(),
            line,
            column,
            kind: Kind::Sql,
        })
    }

    fn set(name: &str, value: &str) -> Kind {
        Kind::Set {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn create_dataset_with_any_whitespace_comments_and_case() {
        for script in [
            "CREATE DATASET x AS SELECT 1",
            "CREATE  DATASET  x  AS  SELECT 1",
            "create dataset x as SELECT 1",
            "CREATE\tDATASET\tx\tAS SELECT 1;",
            "CREATE\nDATASET\r\nx\nAS SELECT 1 ;",
            "CREATE /* a */ DATASET -- b\n x /* c */ AS SELECT 1 -- d",
            "-- lead\nCREATE DATASET \"x\" AS SELECT 1;;",
        ] {
            let s = one(script);
            match &s.kind {
                Kind::CreateDataset { name, query } => {
                    assert_eq!(name, "x", "{script:?}");
                    assert_eq!(query.text, "SELECT 1", "{script:?}");
                    let before = &script[..script.find("SELECT 1").unwrap_or(0)];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                    assert_eq!((query.line, query.column), (line, column), "{script:?}");
                }
                other => panic!("{script:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn positions_of_statements_and_queries() {
        let all =
            split("SET a = 1;\n  -- c\n  CREATE DATASET d AS\n    SELECT 'x;y'\n  ;SHOW DATASETS")
                .expect("split");
        assert_eq!(all.len(), 3);
        assert_eq!(
            (all[0].line, all[0].column, &*all[0].text),
            (1, 1, "SET a = 1")
        );
        assert_eq!((all[1].line, all[1].column), (3, 3));
        assert_eq!(
            all[1].kind,
            Kind::CreateDataset {
                name: "d".into(),
                query: sql("SELECT 'x;y'", 4, 5)
            }
        );
        assert_eq!(all[1].text, "CREATE DATASET d AS\n    SELECT 'x;y'");
        assert_eq!(
            (all[2].line, all[2].column, &all[2].kind),
            (5, 4, &Kind::ShowDatasets)
        );
        // Columns count characters, not bytes.
        let s = split("SELECT 'é';  select 2").expect("split");
        assert_eq!((s[1].line, s[1].column, &*s[1].text), (1, 14, "select 2"));
    }

    #[test]
    fn set_names_and_values() {
        assert_eq!(one("SET prefetch = 16").kind, set("prefetch", "16"));
        assert_eq!(one("set Prefetch TO auto").kind, set("Prefetch", "auto"));
        assert_eq!(one("SET x = 'a;b'").kind, set("x", "a;b"));
        assert_eq!(one("SET x = 'it''s'").kind, set("x", "it's"));
        assert_eq!(one("SET prefetch=-1").kind, set("prefetch", "-1"));
        // Found by `set_values_come_back_as_written`: a keyword as the name.
        assert_eq!(one("SET to = ''").kind, set("to", ""));
        assert_eq!(one("SET as TO to").kind, set("as", "to"));
        assert_eq!(
            one("SET storage . endpoint = 'http://127.0.0.1:9000' -- c").kind,
            set("storage.endpoint", "http://127.0.0.1:9000")
        );
        assert_eq!(
            one("SET storage.endpoint = http://h:1/p").kind,
            set("storage.endpoint", "http://h:1/p")
        );
        assert_eq!(one("SET root = \"/tmp/a b\"").kind, set("root", "/tmp/a b"));
        for bad in [
            "SET",
            "SET x",
            "SET = 1",
            "SET x =",
            "SET x = a b",
            "SET 'x' = 1",
        ] {
            let e = split(bad).expect_err(bad);
            assert!(
                matches!(&e, Error::Script { line: 1, column: 1, source } if matches!(**source, Error::Syntax(_))),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn other_statements() {
        assert_eq!(one("show  datasets").kind, Kind::ShowDatasets);
        assert!(split("SHOW DATASETS x").is_err());
        assert_eq!(one("SHOW TABLES").kind, Kind::Sql);
        assert_eq!(one("CREATE VIEW v AS SELECT 1").kind, Kind::Sql);
        assert_eq!(
            one("explain analyze SELECT 1").kind,
            Kind::Explain {
                analyze: true,
                verbose: false,
                body: sql("SELECT 1", 1, 17)
            }
        );
        assert_eq!(
            one("EXPLAIN VERBOSE create dataset d as select 2").kind,
            Kind::Explain {
                analyze: false,
                verbose: true,
                body: Box::new(Statement {
                    text: "create dataset d as select 2".into(),
                    line: 1,
                    column: 17,
                    kind: Kind::CreateDataset {
                        name: "d".into(),
                        query: sql("select 2", 1, 37)
                    }
                })
            }
        );
        // Only one level: an EXPLAIN inside an EXPLAIN is DataFusion's to refuse.
        assert!(matches!(
            one("EXPLAIN EXPLAIN SELECT 1").kind,
            Kind::Explain { body, .. } if body.kind == Kind::Sql
        ));
        assert_eq!(one("EXPLAIN").kind, Kind::Sql);
        assert!(split("CREATE DATASET x AS").is_err());
        assert!(split("CREATE DATASET AS SELECT 1").is_err());
        assert!(split("CREATE DATASET my data AS SELECT 1").is_err());
        assert!(matches!(
            one("CREATE DATASET my-data.v2 AS SELECT 1").kind,
            Kind::CreateDataset { name, .. } if name == "my-data.v2"
        ));
        // Found by `create_dataset_parts_whatever_the_separators`.
        assert!(matches!(
            one("CREATE DATASET a-as AS SELECT 1").kind,
            Kind::CreateDataset { name, .. } if name == "a-as"
        ));
        for (script, want) in [
            ("CREATE DATASET \"b\"AS SELECT 1", "b"),
            ("CREATE DATASET as AS SELECT 1", "as"),
        ] {
            assert!(
                matches!(&one(script).kind, Kind::CreateDataset { name, query } if name == want && query.text == "SELECT 1"),
                "{script}"
            );
        }
        assert!(
            split("  ;; -- only a comment\n /* and another */ ;")
                .expect("ok")
                .is_empty()
        );
    }

    #[test]
    fn unterminated_text_is_a_located_error() {
        for (script, at) in [
            ("SELECT 1;\nSELECT 'abc", (2, 8)),
            ("SELECT 1; /* never closed", (1, 11)),
            ("SELECT \"abc", (1, 8)),
        ] {
            match split(script) {
                Err(Error::Script {
                    line,
                    column,
                    source,
                }) => {
                    assert_eq!((line, column), at, "{script:?}: {source}");
                    assert!(matches!(*source, Error::Syntax(_)), "{source:?}");
                }
                other => panic!("{script:?}: {other:?}"),
            }
        }
    }

    /// Fragments of SQL for token soups: none holds a `;` outside quotes or an
    /// unterminated quote; line comments end with a newline.
    const FRAGMENTS: &[&str] = &[
        "SELECT",
        "select",
        "CREATE",
        "create",
        "DATASET",
        "dataset",
        "AS",
        "as",
        "SET",
        "set",
        "SHOW",
        "DATASETS",
        "EXPLAIN",
        "ANALYZE",
        "VERBOSE",
        "TO",
        "=",
        "x",
        "\"quoted name\"",
        "\"with;semi\"",
        "'str'",
        "'a;b'",
        "'it''s'",
        "''",
        "1",
        "-1",
        "1.5",
        "(",
        ")",
        ",",
        ".",
        "*",
        "FROM",
        "read_storage('/tmp/x')",
        "-- line;c\n",
        "/* block; */",
        "/* nested /* ; */ */",
        "é",
        "\"é\"",
        "'é;'",
        "storage.region",
        "auto",
        "+",
        "<>",
        "::",
    ];
    const SPACES: &[&str] = &[" ", "  ", "\t", "\n", "\r\n", " \t\n "];

    fn soup() -> impl Strategy<Value = (Vec<Vec<(usize, usize)>>, Vec<usize>)> {
        let stmt = prop::collection::vec((0..FRAGMENTS.len(), 0..SPACES.len()), 0..8);
        (
            prop::collection::vec(stmt, 0..5),
            prop::collection::vec(0..SPACES.len(), 0..6),
        )
    }

    fn is_comment(f: &str) -> bool {
        f.starts_with("--") || f.starts_with("/*")
    }

    /// Between words: any whitespace, comments, or both.
    const SEPARATORS: &[&str] = &[
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        " /* ; */ ",
        "/**/",
        " -- ; 'x\n",
        "\n\t-- c\n  ",
    ];

    /// `kw` in a random ASCII case.
    fn cased(kw: &str, mask: u32) -> String {
        kw.chars()
            .enumerate()
            .map(|(i, c)| {
                if mask >> (i % 32) & 1 == 1 {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(crate::util::fuzz_cases())]

        /// `CREATE DATASET name AS query` with any case and separators gives
        /// the name and the query exactly as written.
        #[test]
        fn create_dataset_parts_whatever_the_separators(
            seps in prop::collection::vec(0..SEPARATORS.len(), 6),
            masks in prop::collection::vec(any::<u32>(), 3),
            name in "[a-z_][a-z0-9_]{0,4}([.-][a-z_][a-z0-9_]{0,3}){0,2}",
            quoted in any::<bool>(),
            query in prop::collection::vec(0..FRAGMENTS.len(), 1..6),
        ) {
            let query: Vec<&str> = query.into_iter().map(|f| FRAGMENTS[f]).filter(|f| !is_comment(f)).collect();
            prop_assume!(!query.is_empty());
            let query = query.join(" ");
            let written = if quoted { format!("\"{name}\"") } else { name.clone() };
            let sep = |i: usize| SEPARATORS[seps[i]];
            let script = format!(
                "{}{}{}{}{}{written}{}{}{}{query}{};",
                sep(0), cased("CREATE", masks[0]), sep(1), cased("DATASET", masks[1]), sep(2),
                sep(3), cased("AS", masks[2]), sep(4), sep(5),
            );
            let all = split(&script);
            let kind = all.as_ref().ok().and_then(|a| a.first()).map(|s| s.kind.clone());
            match kind {
                Some(Kind::CreateDataset { name: n, query: q }) => {
                    prop_assert_eq!(n, name);
                    prop_assert_eq!(q.text, query);
                }
                other => prop_assert!(false, "{:?} {:?}", script, other),
            }
        }

        /// `SET name = 'value'`: any value, quotes doubled, comes back as is.
        #[test]
        fn set_values_come_back_as_written(
            seps in prop::collection::vec(0..SEPARATORS.len(), 4),
            mask in any::<u32>(),
            name in "[a-z_]{1,8}(\\.[a-z_]{1,8})?",
            value in "\\PC{0,20}",
            to in any::<bool>(),
        ) {
            let sep = |i: usize| SEPARATORS[seps[i]];
            let eq = if to { cased("TO", mask) } else { "=".into() };
            let script = format!(
                "{}{}{}{name}{}{eq}{}'{}'",
                sep(0), cased("SET", mask), sep(1), sep(2), sep(3), value.replace('\'', "''")
            );
            let all = split(&script).map_err(|e| TestCaseError::fail(format!("{script:?}: {e}")))?;
            prop_assert_eq!(all.len(), 1);
            prop_assert_eq!(&all[0].kind, &Kind::Set { name, value });
        }

        /// Any text: `Ok` or `Err`, never a panic; statements are in order,
        /// each is its byte range of the script, and what lies between them
        /// is only whitespace, comments and `;`.
        #[test]
        fn any_text_splits_or_errs(script in "\\PC{0,80}|[-;'\"/*\n a-zA-Z=]{0,40}") {
            // An optimizer hint's tokens lie inside its comment (see the header).
            prop_assume!(!script.contains("/*!"));
            if let Ok(all) = statements(&script) {
                let mut prev = 0;
                for (range, stmt) in &all {
                    prop_assert!(prev <= range.start && range.start < range.end);
                    prop_assert_eq!(&script[range.clone()], stmt.text.as_str());
                    let gap = tokenize(&script[prev..range.start]);
                    prop_assert!(gap.is_ok_and(|g| g.iter().all(|t| t.is_space() || t.token == Token::SemiColon)));
                    prev = range.end;
                }
            }
        }

        /// Token soups: the statements are exactly the non-empty pieces
        /// between the `;` separators, each as written (leading and trailing
        /// comments aside), and re-joining them splits the same again.
        #[test]
        fn soups_split_into_their_statements((stmts, seps) in soup()) {
            let mut script = String::new();
            let mut want = Vec::new();
            for (k, frags) in stmts.iter().enumerate() {
                let mut text = String::new();
                let (mut start, mut end) = (None, 0);
                for &(f, s) in frags {
                    let f = FRAGMENTS[f];
                    if !is_comment(f) {
                        start.get_or_insert(text.len());
                        end = text.len() + f.len();
                    }
                    text.push_str(f);
                    text.push_str(SPACES[s]);
                }
                if let Some(start) = start {
                    want.push(text[start..end].to_string());
                }
                script.push_str(&text);
                script.push(';');
                script.push_str(SPACES[seps.get(k).copied().unwrap_or(0)]);
            }
            match split(&script) {
                Ok(all) => {
                    let got: Vec<&str> = all.iter().map(|s| s.text.as_str()).collect();
                    prop_assert_eq!(&got, &want);
                    let again = split(&got.join(";\n")).map(|a| a.into_iter().map(|s| s.text).collect::<Vec<_>>());
                    prop_assert_eq!(again.ok(), Some(want.clone()));
                    let nonspace = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
                    prop_assert_eq!(nonspace(&got.concat()), nonspace(&want.concat()));
                }
                // Only udfchain's own statements may be refused (a soup can
                // make a malformed SET or CREATE DATASET).
                Err(Error::Script { source, .. }) => prop_assert!(matches!(*source, Error::Syntax(_)), "{:?}", source),
                Err(e) => prop_assert!(false, "{e:?}"),
            }
        }
    }
}
