//! The SQL built-ins `image_decode(file)` and `image_thumbnail(file,
//! max_side)` as one map UDF over a batch: the rows' files are read (from
//! their prefetched copies) one after another, then decoded data-parallel on
//! rayon's pool, so one call keeps every core busy. A per-row typed function
//! (`udfs::map_fn(.., image_decode)`) decodes the rows of a call one after
//! another, and calls come `parallel` at a time in runs of rows: for a
//! kernel of a few milliseconds a run at a time left cores idle.
//!
//! Guarantees: each row's outcome is its own (a file that does not read or
//! decode is that row's error, naming the file; a null file is an error);
//! the values are exactly those of [`image_decode`](super::image_decode) /
//! [`image_thumbnail`](super::image_thumbnail) for the same bytes.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use rayon::prelude::*;

use super::{DecodeOptions, Filter, Image, Mode, blocking, decode, image_decode, resize_to_fit};
use crate::codec::{decode_rows, encode_column};
use crate::error::{CallError, UdfError};
use crate::file::File;
use crate::signature::Signature;
use crate::udf::{EachRow, Mapper, map_fn};

/// `image_decode` reading column `param`, writing `output`; with
/// `thumbnail = Some(side)`, `image_thumbnail(param, side)`.
pub fn decode_udf(
    param: &str,
    output: &str,
    thumbnail: Option<u32>,
) -> Result<Arc<dyn Mapper>, UdfError> {
    // The signature a typed UDF of the same function would have.
    let signature = map_fn(&[param], output, image_decode)?.signature().clone();
    Ok(Arc::new(DecodeUdf {
        signature,
        thumbnail,
    }))
}

#[derive(Debug)]
struct DecodeUdf {
    signature: Signature,
    thumbnail: Option<u32>,
}

impl DecodeUdf {
    /// One row's image from its bytes.
    fn one(&self, file: &File, bytes: &[u8]) -> Result<Image, UdfError> {
        let options = match self.thumbnail {
            None => DecodeOptions::default(),
            Some(side) => DecodeOptions {
                mode: Some(Mode::Rgb),
                max_side: Some(side),
                ..DecodeOptions::default()
            },
        };
        let img = decode(bytes, &options).map_err(|e| UdfError::Read {
            url: file.url(),
            source: Box::new(e),
        })?;
        match self.thumbnail {
            None => Ok(img),
            Some(side) => resize_to_fit(img.view(), side, Filter::Bicubic),
        }
    }
}

#[async_trait]
impl Mapper for DecodeUdf {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    async fn map(&self, input: RecordBatch) -> Result<ArrayRef, CallError> {
        let each = self.map_each(input, true).await?;
        for (row, outcome) in each.outcomes.into_iter().enumerate() {
            if let Err(e) = outcome {
                return Err(CallError::at_row(row, e.source));
            }
        }
        Ok(each.values)
    }

    async fn map_each(
        &self,
        input: RecordBatch,
        stop_at_error: bool,
    ) -> Result<EachRow, CallError> {
        let files: Vec<Option<File>> = decode_rows(&input, &self.signature.params)?;
        let mut read = Vec::with_capacity(files.len());
        for file in &files {
            let bytes = match file {
                Some(f) => f.read().await.map(|b| (f, b)),
                None => Err(UdfError::Contract("a null file".into())),
            };
            let failed = bytes.is_err();
            read.push(bytes);
            if failed && stop_at_error {
                break;
            }
        }
        let decoded: Vec<Result<Image, UdfError>> = blocking(|| {
            read.into_par_iter()
                .map(|r| r.and_then(|(f, bytes)| self.one(f, &bytes)))
                .collect()
        });
        let mut values = Vec::with_capacity(decoded.len());
        let mut outcomes = Vec::with_capacity(decoded.len());
        for d in decoded {
            let stop = d.is_err() && stop_at_error;
            match d {
                Ok(img) => {
                    values.push(img);
                    outcomes.push(Ok(()));
                }
                Err(e) => outcomes.push(Err(CallError::whole(e))),
            }
            if stop {
                break;
            }
        }
        let values = encode_column(&self.signature.output, &values).map_err(CallError::whole)?;
        Ok(EachRow { values, outcomes })
    }
}
