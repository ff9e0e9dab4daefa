//! Files named by URL: [`File::from_url`] in Rust and the `file_from_url(url)`
//! scalar function ([`FileFromUrl`]) turn strings such as
//! `https://host/img/1.jpg`, `s3://bucket/key` or `gs://bucket/key` into
//! [`File`] values that the engine reads like listed files.
//!
//! Decisions (each is what the rest of the engine relies on):
//! - `source` is `scheme://host[:port]` (for `s3://`, `gs://`, `az://` the
//!   host is the bucket or container) and `path` the object key, URL-decoded
//!   (`a%20b.jpg` names the key `a b.jpg`), as a listing of the store's root
//!   would give. So [`File::url`] gives the URL back, the store is found by
//!   scheme and host like a listed file's, and the cache key (source + path)
//!   is the URL's.
//! - Nothing is known of the object before its first GET: `size` is 0 with no
//!   `etag`, `version` or `last_modified`, which [`File::size_known`] reads as
//!   "size unknown". The engine's first GET (the prefetch's download) pins the
//!   object's size and etag (or version) from the response and passes the row
//!   on with them, so every later read of that row, by this UDF or the next,
//!   asks for that version (`If-Match`) and checks that size.
//! - Accepted schemes: `s3`, `s3a`, `gs`, `az`, `abfs`, `abfss`, `http`,
//!   `https`. `file://` and `memory://` are refused: a table of URLs is input
//!   data, and must not make the engine read any local file it names.
//! - A string that is not such a URL (empty, no `scheme://`, another scheme,
//!   no host or no key, user info, a `?query` or `#fragment`, which no object
//!   key holds) is an error from [`File::from_url`]. `file_from_url` keeps the
//!   row instead, as a `File` with an empty `source` and the string as `path`:
//!   reading it fails with the same error, for that row, so `on_error` decides
//!   (skip lists it, null makes its result null, fail fails the query naming
//!   it). A null string gives a null `File`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::object_store::path::Path;

use crate::codec::encode_column;
use crate::error::UdfError;
use crate::file::File;

/// The schemes a URL file may have.
const SCHEMES: [&str; 8] = ["s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https"];

impl File {
    /// The file at `url` (`https://host/img/1.jpg`, `s3://bucket/key`,
    /// `gs://bucket/key`): `source` is `scheme://host[:port]`, `path` the key,
    /// its size unknown (0) until the engine's first GET pins size and etag.
    /// See the module header for what is refused and why.
    ///
    /// ```
    /// use udfchain_udfs::File;
    /// let f = File::from_url("s3://bucket/img/a%20b.jpg").unwrap();
    /// assert_eq!((f.source.as_str(), f.path.as_str()), ("s3://bucket", "img/a b.jpg"));
    /// assert!(!f.size_known());
    /// assert!(File::from_url("img/1.jpg").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<File, UdfError> {
        let bad = |reason: &str| UdfError::NotAUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        if url.trim().is_empty() {
            return Err(bad("empty"));
        }
        let parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(url::ParseError::RelativeUrlWithoutBase) => {
                return Err(bad("no scheme (write scheme://host/key)"));
            }
            Err(e) => return Err(bad(&e.to_string())),
        };
        let scheme = parsed.scheme();
        if !SCHEMES.contains(&scheme) {
            return Err(bad(&format!(
                "unsupported scheme {scheme}:// (use http(s)://, s3://, gs:// or az://; \
                 local files are not read from URLs)"
            )));
        }
        let host = parsed.host_str().unwrap_or("");
        if host.is_empty() {
            return Err(bad("no host or bucket"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "credentials in a URL are not supported (use storage options)",
            ));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(bad(
                "'?' and '#' start a query or fragment, which no object key holds \
                 (write them as %3F and %23)",
            ));
        }
        let key = Path::from_url_path(parsed.path()).map_err(|e| bad(&e.to_string()))?;
        if key.as_ref().is_empty() {
            return Err(bad("no object key after the host"));
        }
        let source = match parsed.port() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        };
        Ok(File {
            source,
            path: key.as_ref().to_string(),
            ..File::default()
        })
    }

    /// False for a file named by URL before its first GET (size 0 and no
    /// etag, version or modification time: nothing is known of it yet); true
    /// for a listed file, whose `size` is its size (0 for an empty object).
    pub fn size_known(&self) -> bool {
        self.size > 0
            || self.etag.is_some()
            || self.version.is_some()
            || self.last_modified.is_some()
    }

    /// A file `file_from_url` could not parse: an empty `source` and the
    /// string as `path`. [`File::url_error`] says why.
    fn unparsed(url: &str) -> File {
        File {
            path: url.to_string(),
            ..File::default()
        }
    }

    /// Why this file cannot be read from any store: its `source` is empty
    /// (`file_from_url` kept a string that is not a URL, see the module
    /// header). `None` for a file with a source.
    pub fn url_error(&self) -> Option<UdfError> {
        if !self.source.is_empty() {
            return None;
        }
        Some(
            File::from_url(&self.path)
                .err()
                .unwrap_or_else(|| UdfError::NotAUrl {
                    url: self.path.clone(),
                    reason: "a File without a source".to_string(),
                }),
        )
    }
}

/// `file_from_url(url)`: a `File` per string (see the module header).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FileFromUrl {
    signature: Signature,
}

impl FileFromUrl {
    /// The scalar function, for registering in a session or calling in an
    /// expression.
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::string(1, Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for FileFromUrl {
    fn name(&self) -> &str {
        "file_from_url"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(File::data_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return Err(DataFusionError::Plan(format!(
                "file_from_url takes one string, got {} arguments",
                args.args.len()
            )));
        };
        let scalar = matches!(arg, ColumnarValue::Scalar(_));
        let strings = cast(&arg.to_array(args.number_rows)?, &DataType::Utf8)?;
        let strings = strings.as_string::<i32>();
        let files: Vec<Option<File>> = strings
            .iter()
            .map(|s| s.map(|s| File::from_url(s).unwrap_or_else(|_| File::unparsed(s))))
            .collect();
        let field = Field::new("file", File::data_type(), true);
        let array: ArrayRef =
            encode_column(&field, &files).map_err(|e| DataFusionError::External(Box::new(e)))?;
        if scalar && array.len() == 1 {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &array, 0,
            )?));
        }
        Ok(ColumnarValue::Array(Arc::clone(&array)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_gives_source_and_key() {
        for (url, source, path) in [
            ("https://host/img/1.jpg", "https://host", "img/1.jpg"),
            ("http://127.0.0.1:8080/a/b", "http://127.0.0.1:8080", "a/b"),
            ("s3://bucket/k%23ey", "s3://bucket", "k#ey"),
            ("gs://b/x y", "gs://b", "x y"),
        ] {
            let f = File::from_url(url).expect(url);
            assert_eq!((f.source.as_str(), f.path.as_str()), (source, path));
            assert!(!f.size_known(), "{url}");
            assert!(f.url_error().is_none());
        }
        assert_eq!(
            File::from_url("https://host/img/1.jpg").expect("ok").url(),
            "https://host/img/1.jpg"
        );
    }

    #[test]
    fn a_string_that_is_no_url_says_why() {
        for (url, why) in [
            ("", "empty"),
            ("img/1.jpg", "no scheme"),
            ("ftp://h/x", "unsupported scheme ftp"),
            ("file:///etc/passwd", "unsupported scheme file"),
            ("https://host/", "no object key"),
            ("https://u:p@host/x", "credentials"),
            ("https://host/x?sig=1", "query"),
        ] {
            let e = File::from_url(url).expect_err(url).to_string();
            assert!(e.contains(why), "{url}: {e}");
            let kept = File::unparsed(url);
            let again = kept.url_error().expect("no source").to_string();
            assert_eq!(again, e);
        }
    }

    #[test]
    fn the_function_keeps_nulls_and_bad_strings_per_row() {
        use datafusion::arrow::array::StringArray;
        use datafusion::config::ConfigOptions;
        let urls = StringArray::from(vec![Some("s3://b/k"), None, Some("nope")]);
        let udf = FileFromUrl::udf();
        let out = udf
            .invoke_with_args(ScalarFunctionArgs {
                args: vec![ColumnarValue::Array(Arc::new(urls))],
                arg_fields: vec![Arc::new(Field::new("u", DataType::Utf8, true))],
                number_rows: 3,
                return_field: Arc::new(Field::new("f", File::data_type(), true)),
                config_options: Arc::new(ConfigOptions::default()),
            })
            .expect("invoke")
            .to_array(3)
            .expect("array");
        let files: Vec<Option<File>> = crate::decode_column(&out).expect("decode");
        assert_eq!(files[0].as_ref().map(|f| f.path.as_str()), Some("k"));
        assert_eq!(files[1], None);
        assert!(files[2].as_ref().and_then(File::url_error).is_some());
    }
}
