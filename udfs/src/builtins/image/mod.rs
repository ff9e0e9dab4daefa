//! Images: their header (`image_size`), and images as values of the engine
//! ([`Image`], an Arrow struct of width, height, mode and pixels) decoded
//! natively from stored files (`image_decode`, `image_thumbnail`) and
//! transformed (resize, crop, convert, encode), one image at a time or a
//! whole column at a time on rayon's pool ([`map_column`]).
//!
//! Files: `size.rs` (header only, ranged reads), `value.rs` (the value and
//! its Arrow layout), `decode.rs` (bytes to pixels, bounded), `jpeg_scaled.rs`
//! (a JPEG at 1/2..1/8 scale by libjpeg-turbo, the crate's only C), `ops.rs` (the
//! operations), `tensor.rs` (many images to one fixed-shape tensor column). See docs/images.md.

mod decode;
mod decode_udf;
mod functions;
mod jpeg_scaled;
mod ops;
mod size;
mod tensor;
mod value;

use datafusion::arrow::array::{Array, ArrayRef};
use rayon::prelude::*;

pub use decode::{DecodeOptions, ImageError, MAX_IMAGE_PIXELS, decode};
pub use decode_udf::{DecodeInput, DecodeSpec, Resize, decode_udf};
pub use functions::{center_crop_expr, convert_expr, functions, resize_expr, resize_to_fit_expr};
pub use ops::{
    Filter, Format, MAX_SIDE, center_crop, convert, crop, encode, fit_size, resize, resize_to_fit,
};
pub use size::{ImageSize, MAX_HEADER_BYTES, MAX_READS, image_size};
pub use tensor::{TensorShape, decode_to_tensor, images_to_tensor, to_tensor_function};
pub use value::{Image, ImageView, Mode};

use crate::error::UdfError;
use crate::file::File;

/// The image in a stored file, in its natural mode (`L`, `RGB` or `RGBA`);
/// a file that is not an image, is corrupt or over [`MAX_IMAGE_PIXELS`] is
/// that row's error.
pub async fn image_decode(file: File) -> Result<Image, UdfError> {
    decode_file(file, DecodeSpec::default()).await
}

/// A thumbnail of a stored image: RGB, its longer side at most `max_side`,
/// decoded at reduced size where the format allows (a JPEG in the DCT).
pub async fn image_thumbnail(file: File, max_side: u32) -> Result<Image, UdfError> {
    decode_file(file, DecodeSpec::thumbnail(max_side)).await
}

/// The image in a stored file, decoded as `spec` says.
pub async fn decode_file(file: File, spec: DecodeSpec) -> Result<Image, UdfError> {
    let bytes = file.read().await?;
    spec.apply_to(&file, &bytes)
}

/// `f` of every image of the image column `array`, computed in parallel on
/// rayon's pool (nulls stay null); the first error, naming its row, fails
/// the column. Call it off the I/O runtime.
pub fn map_column(
    array: &dyn Array,
    f: impl Fn(ImageView<'_>) -> Result<Image, UdfError> + Sync,
) -> Result<ArrayRef, UdfError> {
    let views = Image::views(array)?;
    let out: Vec<Option<Image>> = views
        .par_iter()
        .enumerate()
        .map(|(row, v)| match v {
            Some(v) => f(*v)
                .map(Some)
                .map_err(|e| UdfError::Contract(format!("row {row}: {e}"))),
            None => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    Ok(Image::to_array(out.iter().map(Option::as_ref)))
}

#[cfg(test)]
mod tests;

/// `f` run where blocking is allowed: on a multi-threaded tokio worker
/// through `block_in_place` (its other tasks move to other threads).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
