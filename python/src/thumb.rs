//! `image_thumbnail_jpeg(data, max_side)`: a JPEG thumbnail of encoded image
//! bytes, made natively (`udfchain::udfs::builtins::image`: decoded at
//! reduced size where the format allows, with the pixel limit checked before
//! any pixel buffer exists), for notebook display (`Chain._repr_html_`).
//! Bytes that are not an image, or are corrupt or too large, raise
//! `ValueError`; the GIL is released while decoding.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use udfchain::udfs::builtins::image::{
    DecodeOptions, Filter, Format, Mode, decode, encode, resize_to_fit,
};

/// Images of more pixels are refused here (a 64-megapixel photo passes).
const MAX_PIXELS: u64 = 64 << 20;

#[pyfunction]
pub fn image_thumbnail_jpeg<'py>(
    py: Python<'py>,
    data: &[u8],
    max_side: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let side = max_side.clamp(1, 4096);
    let made = py.detach(|| {
        let options = DecodeOptions {
            mode: Some(Mode::Rgb),
            max_side: Some(side),
            max_pixels: MAX_PIXELS,
        };
        let img = decode(data, &options).map_err(|e| e.to_string())?;
        let small = resize_to_fit(img.view(), side, Filter::Bilinear).map_err(|e| e.to_string())?;
        encode(small.view(), Format::Jpeg, Some(80)).map_err(|e| e.to_string())
    });
    match made {
        Ok(jpeg) => Ok(PyBytes::new(py, &jpeg)),
        Err(e) => Err(PyValueError::new_err(e)),
    }
}
