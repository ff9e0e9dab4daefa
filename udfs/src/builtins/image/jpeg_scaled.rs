//! A JPEG decoded at a DCT scale (1/2, 1/4 or 1/8 of its size) by
//! libjpeg-turbo's decoder (the C library `mozjpeg-sys` builds, without
//! SIMD): the scaled inverse DCT turns each 8x8 block into 4x4, 2x2 or one
//! pixel, so a thumbnail never holds the full image.
//!
//! Guarantees, for any bytes (tests: `jpeg_scaled_*` and the mutation
//! properties in `tests.rs`):
//! - libjpeg's fatal errors unwind out of its C frames (compiled with
//!   `-fexceptions`) through `error_exit`, which formats the message and
//!   `resume_unwind`s (no panic hook, nothing printed); the decode runs in
//!   `catch_unwind`, so the error is returned as its message, and
//!   `jpeg_destroy_decompress` runs on every path (a guard). A panic that is
//!   not libjpeg's continues unwinding. Built with `panic = "abort"`, nothing
//!   can unwind, so [`decode_scaled`] declines (`None`: the full decoder).
//! - Warnings (damaged entropy data, extraneous bytes before a marker) are
//!   counted, never printed, and do not fail the image: libjpeg fills what
//!   it could not decode, as zune-jpeg (the full decoder) does. A JPEG cut
//!   short is refused before either decoder sees it (`decode.rs`).
//! - Memory: libjpeg's memory manager is held to `budget`
//!   (`max_memory_to_use`, which bounds the whole-image coefficient buffer
//!   of a progressive JPEG), the output's `width * height * components` is
//!   checked against it before the buffer exists, and a JPEG of more than
//!   [`MAX_SCANS`] scans is refused (a few bytes of end-of-band runs make a
//!   progressive scan a pass over every block).
//! - The result is `None` (decode it whole) unless libjpeg reads the size the
//!   caller read from the header, its pixels are gray or YCbCr/RGB (CMYK and
//!   YCCK go to the full decoder, which converts them) and a scale below 1
//!   keeps the longer side at least `side`.
// The one module of this crate that calls C: every `unsafe` block below says
// why it holds.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_ulong};
use std::mem;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use mozjpeg_sys::{
    J_COLOR_SPACE, jpeg_common_struct, jpeg_decompress_struct, jpeg_error_mgr, jpeg_progress_mgr,
};

/// More scans than this is an error (libjpeg-turbo's own tools suggest 500
/// as the limit for untrusted input; real progressive files have about 10).
pub(super) const MAX_SCANS: c_int = 500;

/// Pixels decoded at a reduced scale: `Gray` one byte a pixel, `Rgb` three,
/// rows top to bottom.
#[derive(Debug)]
pub(super) struct Scaled {
    pub width: u32,
    pub height: u32,
    pub gray: bool,
    pub pixels: Vec<u8>,
}

/// `bytes`, a JPEG of `width x height` (as the caller read its header),
/// decoded at the smallest of 1/2, 1/4, 1/8 whose longer side is still at
/// least `side`; `Ok(None)` when none is (or see the module header); an
/// error is libjpeg's message.
pub(super) fn decode_scaled(
    bytes: &[u8],
    (width, height): (u32, u32),
    side: u32,
    budget: u64,
) -> Result<Option<Scaled>, String> {
    if cfg!(panic = "abort") {
        return Ok(None);
    }
    let mut d = Decompressor::new();
    match catch_unwind(AssertUnwindSafe(|| {
        d.run(bytes, (width, height), side, budget)
    })) {
        Ok(result) => result,
        Err(payload) => match payload.downcast::<LibjpegError>() {
            Ok(e) => Err(e.0),
            Err(other) => resume_unwind(other),
        },
    }
    // `d` drops here: jpeg_destroy_decompress, whatever happened.
}

/// The payload of an unwind out of libjpeg: its formatted message.
struct LibjpegError(String);

/// libjpeg's decompressor and the managers it points to, boxed so their
/// addresses stay put; dropping it destroys the decompressor.
struct Decompressor {
    cinfo: Box<jpeg_decompress_struct>,
    _err: Box<jpeg_error_mgr>,
    progress: Box<jpeg_progress_mgr>,
}

impl Decompressor {
    fn new() -> Self {
        // SAFETY: these are C structs of integers, raw pointers and optional
        // function pointers, for which all zeros is the valid "unset" value
        // (libjpeg's own examples start from zeroed memory; jpeg_destroy of a
        // zeroed or half-created struct only frees what it finds).
        let (mut cinfo, mut err, mut progress): (
            Box<jpeg_decompress_struct>,
            Box<jpeg_error_mgr>,
            Box<jpeg_progress_mgr>,
        ) = unsafe {
            (
                Box::new(mem::zeroed()),
                Box::new(mem::zeroed()),
                Box::new(mem::zeroed()),
            )
        };
        // SAFETY: `err` is a valid error manager to fill with the defaults.
        unsafe { mozjpeg_sys::jpeg_std_error(&mut err) };
        err.error_exit = Some(error_exit);
        err.emit_message = Some(emit_message);
        err.output_message = Some(output_message);
        // SAFETY: the same signature but for a raw pointer in place of a
        // reference (passed alike): the monitor reads past the common part
        // of the decompressor, which a `&mut jpeg_common_struct` may not.
        progress.progress_monitor = Some(unsafe {
            mem::transmute::<
                unsafe extern "C-unwind" fn(*mut jpeg_common_struct),
                unsafe extern "C-unwind" fn(&mut jpeg_common_struct),
            >(progress_monitor)
        });
        cinfo.common.err = &raw mut *err;
        Self {
            cinfo,
            _err: err,
            progress,
        }
    }

    /// The decode; libjpeg's errors unwind out of it.
    fn run(
        &mut self,
        bytes: &[u8],
        (width, height): (u32, u32),
        side: u32,
        budget: u64,
    ) -> Result<Option<Scaled>, String> {
        let len = c_ulong::try_from(bytes.len()).map_err(|_| "a JPEG of over 4 GiB".to_string())?;
        // SAFETY: `cinfo` is zeroed with its error manager set, as
        // jpeg_create_decompress requires; the struct size and version are
        // those mozjpeg-sys was built with.
        unsafe { mozjpeg_sys::jpeg_create_decompress(&mut *self.cinfo) };
        // Create zeroes all but the error manager (and client data).
        self.cinfo.common.progress = &raw mut *self.progress;
        let cinfo = &mut *self.cinfo;
        // SAFETY: created above, so `mem` points to libjpeg's memory manager.
        unsafe {
            (*cinfo.common.mem).max_memory_to_use =
                mozjpeg_sys::c_long::try_from(budget).unwrap_or(mozjpeg_sys::c_long::MAX);
        }
        // SAFETY: `bytes` outlives the decompressor's use of it: `run` ends
        // before `decode_scaled` returns, and nothing reads the source after.
        unsafe { mozjpeg_sys::jpeg_mem_src(cinfo, bytes.as_ptr(), len) };
        // SAFETY: a created decompressor with a source; errors unwind.
        if unsafe { mozjpeg_sys::jpeg_read_header(cinfo, 1) } != 1 {
            return Err("no image in the JPEG".into());
        }
        if (cinfo.image_width, cinfo.image_height) != (width, height) {
            return Ok(None);
        }
        let gray = match (cinfo.jpeg_color_space, cinfo.num_components) {
            (J_COLOR_SPACE::JCS_GRAYSCALE, 1) => true,
            (J_COLOR_SPACE::JCS_YCbCr | J_COLOR_SPACE::JCS_RGB, 3) => false,
            _ => return Ok(None),
        };
        cinfo.out_color_space = if gray {
            J_COLOR_SPACE::JCS_GRAYSCALE
        } else {
            J_COLOR_SPACE::JCS_RGB
        };
        let mut scaled = false;
        for denom in [8, 4, 2] {
            cinfo.scale_num = 1;
            cinfo.scale_denom = denom;
            // SAFETY: called after jpeg_read_header, as libjpeg requires.
            unsafe { mozjpeg_sys::jpeg_calc_output_dimensions(cinfo) };
            if cinfo.output_width.max(cinfo.output_height) >= side {
                scaled = true;
                break;
            }
        }
        if !scaled {
            return Ok(None);
        }
        // The output's size as jpeg_calc_output_dimensions set it, checked
        // before libjpeg reads the scans or the buffer exists.
        let (w, h) = (cinfo.output_width, cinfo.output_height);
        let channels = usize::try_from(cinfo.output_components).unwrap_or(0);
        if channels != if gray { 1 } else { 3 } {
            return Err(format!("libjpeg gives {channels} components"));
        }
        let row = usize::try_from(w)
            .ok()
            .and_then(|w| w.checked_mul(channels))
            .filter(|&r| r > 0)
            .ok_or("a JPEG row that does not fit in memory")?;
        let size = usize::try_from(h)
            .ok()
            .and_then(|h| h.checked_mul(row))
            .filter(|&s| u64::try_from(s).is_ok_and(|s| s <= budget))
            .ok_or_else(|| format!("a {w}x{h} JPEG output is over the memory budget"))?;
        // SAFETY: after jpeg_read_header with the parameters set; errors unwind.
        unsafe { mozjpeg_sys::jpeg_start_decompress(cinfo) };
        if (
            cinfo.output_width,
            cinfo.output_height,
            cinfo.output_components,
        ) != (w, h, c_int::try_from(channels).unwrap_or(0))
        {
            return Err("libjpeg changed the output size".into());
        }
        let mut pixels = vec![0u8; size];
        while cinfo.output_scanline < h {
            let start = usize::try_from(cinfo.output_scanline)
                .ok()
                .and_then(|y| y.checked_mul(row))
                .and_then(|at| pixels.get_mut(at..))
                .ok_or("libjpeg is past the last row")?;
            // Up to 4 rows a call: libjpeg's `rec_outbuf_height` is at most 4.
            let mut rows = [std::ptr::null_mut::<u8>(); 4];
            let mut n = 0;
            for (slot, r) in rows.iter_mut().zip(start.chunks_exact_mut(row)) {
                *slot = r.as_mut_ptr();
                n += 1;
            }
            // SAFETY: each pointer is the start of a whole output row of
            // `row` bytes inside `pixels`, which outlives the call; libjpeg
            // writes at most `n` rows of `output_width * output_components`.
            let got = unsafe { mozjpeg_sys::jpeg_read_scanlines(cinfo, rows.as_mut_ptr(), n) };
            if got == 0 {
                return Err("libjpeg returned no rows".into());
            }
        }
        Ok(Some(Scaled {
            width: w,
            height: h,
            gray,
            pixels,
        }))
    }
}

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: the struct is zeroed, half-created or created (possibly
        // left mid-decode by an unwind); jpeg_destroy_decompress frees what
        // its memory manager holds in each case and never fails.
        unsafe { mozjpeg_sys::jpeg_destroy_decompress(&mut self.cinfo) };
    }
}

/// libjpeg's message for the current `msg_code`.
fn message(cinfo: &mut jpeg_common_struct) -> String {
    // SAFETY: `err` is our error manager (set before any libjpeg call).
    let Some(format) = (unsafe { (*cinfo.err).format_message }) else {
        return "libjpeg error".into();
    };
    // libjpeg writes up to JMSG_LENGTH_MAX (200) bytes; mozjpeg-sys declares
    // the buffer as `&[u8; 80]`, so call it through a raw pointer to ours.
    let mut buffer = [0u8; 256];
    // SAFETY: the same C function; references and raw pointers pass alike.
    let format: unsafe extern "C-unwind" fn(*mut jpeg_common_struct, *mut u8) =
        unsafe { mem::transmute(format) };
    // SAFETY: `buffer` holds more than the JMSG_LENGTH_MAX bytes written.
    unsafe { format(cinfo, buffer.as_mut_ptr()) };
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// libjpeg's fatal error: unwind to `decode_scaled` with its message.
unsafe extern "C-unwind" fn error_exit(cinfo: &mut jpeg_common_struct) {
    let msg = message(cinfo);
    resume_unwind(Box::new(LibjpegError(msg)))
}

/// Warnings (`level < 0`) are counted, trace messages dropped; none is
/// printed or fails the image (see the module header).
unsafe extern "C-unwind" fn emit_message(cinfo: &mut jpeg_common_struct, level: c_int) {
    if level < 0 {
        // SAFETY: `err` is our error manager.
        unsafe { (*cinfo.err).num_warnings += 1 };
    }
}

/// Nothing is printed.
unsafe extern "C-unwind" fn output_message(_cinfo: &mut jpeg_common_struct) {}

/// Refuses a JPEG of more than [`MAX_SCANS`] scans.
unsafe extern "C-unwind" fn progress_monitor(cinfo: *mut jpeg_common_struct) {
    // SAFETY: only our decompressor has this monitor, libjpeg passes the
    // pointer to the whole struct it was given, and `common` is the first
    // field of the `#[repr(C)]` decompress struct.
    let scan = unsafe { (*cinfo.cast::<jpeg_decompress_struct>()).input_scan_number };
    if scan > MAX_SCANS {
        resume_unwind(Box::new(LibjpegError(format!(
            "a JPEG of more than {MAX_SCANS} scans"
        ))))
    }
}

/// A progressive JPEG of `pixels` (`components` a pixel: 1 gray, 3 RGB, 4
/// CMYK, rows top to bottom) by mozjpeg's encoder, whose defaults write
/// progressive scans: test images the `image` crate's encoder cannot write.
#[cfg(test)]
pub(super) fn encode_progressive(
    pixels: &[u8],
    (width, height): (u32, u32),
    components: usize,
    quality: c_int,
) -> Vec<u8> {
    use mozjpeg_sys::jpeg_compress_struct;
    let row = width as usize * components;
    assert_eq!(pixels.len(), row * height as usize, "pixels of the size");
    // A buffer libjpeg never outgrows (else it would malloc its own).
    let mut out = vec![0u8; pixels.len() * 2 + (64 << 10)];
    let mut at = out.as_mut_ptr();
    let mut len = c_ulong::try_from(out.len()).expect("size");
    // SAFETY: as in `Decompressor`: zeroed structs, the error manager set
    // before create, every pointer handed to libjpeg (the error manager, the
    // output buffer and its length, each input row) outlives the calls; the
    // compressor is destroyed before they go. An error unwinds (the test fails).
    unsafe {
        let mut err: Box<jpeg_error_mgr> = Box::new(mem::zeroed());
        mozjpeg_sys::jpeg_std_error(&mut err);
        err.error_exit = Some(error_exit);
        err.emit_message = Some(emit_message);
        err.output_message = Some(output_message);
        let mut c: Box<jpeg_compress_struct> = Box::new(mem::zeroed());
        c.common.err = &raw mut *err;
        mozjpeg_sys::jpeg_create_compress(&mut *c);
        mozjpeg_sys::jpeg_mem_dest(&mut c, &mut at, &mut len);
        c.image_width = width;
        c.image_height = height;
        c.input_components = c_int::try_from(components).expect("components");
        c.in_color_space = match components {
            1 => J_COLOR_SPACE::JCS_GRAYSCALE,
            3 => J_COLOR_SPACE::JCS_RGB,
            _ => J_COLOR_SPACE::JCS_CMYK,
        };
        mozjpeg_sys::jpeg_set_defaults(&mut c);
        mozjpeg_sys::jpeg_set_quality(&mut c, quality, 1);
        mozjpeg_sys::jpeg_simple_progression(&mut c);
        mozjpeg_sys::jpeg_start_compress(&mut c, 1);
        for r in pixels.chunks_exact(row) {
            let rows = [r.as_ptr()];
            mozjpeg_sys::jpeg_write_scanlines(&mut c, rows.as_ptr(), 1);
        }
        mozjpeg_sys::jpeg_finish_compress(&mut c);
        mozjpeg_sys::jpeg_destroy_compress(&mut c);
    }
    assert_eq!(at, out.as_mut_ptr(), "libjpeg wrote into the buffer given");
    out.truncate(usize::try_from(len).expect("length"));
    out
}
