//! Images decoded natively from stored files and transformed in SQL and in
//! Rust chains: the same pixels as the functions called directly, hostile
//! files as per-row errors under `on_error`.

use datafusion::arrow::array::{Array, AsArray};
use udfchain::udfs::builtins::image::{
    DecodeOptions, Filter, Format, Image, Mode, convert, decode, encode, image_decode, resize,
    resize_expr, resize_to_fit,
};
use udfchain::{Output, Session, Settings, col};

use udfchain_testkit::runner;

/// A `w` x `h` RGB test image with gradients and texture.
fn picture(w: u32, h: u32, seed: u32) -> Image {
    let mut data = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            data.extend_from_slice(&[
                ((x * 255 / w + seed) % 256) as u8,
                ((y * 255 / h) % 256) as u8,
                ((x * 7 + y * 13 + seed * 31) % 256) as u8,
            ]);
        }
    }
    Image::new(w, h, Mode::Rgb, data).expect("image")
}

/// `n` PNG and JPEG files of 48x32 and one file that is not an image.
fn image_dir(n: u32) -> (tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let dir = tempfile::tempdir().expect("dir");
    let mut files = Vec::new();
    for i in 0..n {
        let (name, format) = if i % 2 == 0 {
            (format!("img{i:02}.png"), Format::Png)
        } else {
            (format!("img{i:02}.jpg"), Format::Jpeg)
        };
        let bytes = encode(picture(48, 32, i).view(), format, Some(90)).expect("encode");
        std::fs::write(dir.path().join(&name), &bytes).expect("write");
        files.push((name, bytes));
    }
    std::fs::write(
        dir.path().join("broken.jpg"),
        b"\xff\xd8\xff\xe0 not really a jpeg",
    )
    .expect("write");
    (dir, files)
}

/// The last table a script returns.
async fn last_table(
    r: &udfchain::ScriptRunner,
    sql: &str,
) -> Vec<datafusion::arrow::array::RecordBatch> {
    let outputs = r.run(sql).await.expect("run");
    let Some(Output::Table(batches)) = outputs.into_iter().last() else {
        panic!("a table")
    };
    batches
}

/// The bytes written for the file at `path`.
fn bytes_of<'a>(files: &'a [(String, Vec<u8>)], path: &str) -> &'a [u8] {
    &files
        .iter()
        .find(|(n, _)| n == path)
        .expect("a written file")
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_decodes_resizes_and_encodes_and_skips_a_broken_file() {
    let (dir, files) = image_dir(6);
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let d = dir.path().display();
    let script = format!(
        "SET on_error = 'skip';
         SELECT file.path AS path,
                image_resize(image_decode(file), 24, 16, 'bilinear') AS small,
                image_encode(image_center_crop(image_decode(file), 16, 16), 'png') AS png
         FROM read_storage('{d}') ORDER BY path"
    );
    let batches = last_table(&r, &script).await;
    let mut rows = 0;
    for b in &batches {
        let paths = b.column(0).as_string::<i32>();
        let small = Image::views(b.column(1).as_ref()).expect("images");
        let pngs = b.column(2).as_binary::<i32>();
        for (i, small) in small.iter().enumerate() {
            let bytes = bytes_of(&files, paths.value(i));
            let want = resize(
                decode(bytes, &DecodeOptions::default())
                    .expect("decode")
                    .view(),
                24,
                16,
                Filter::Bilinear,
            )
            .expect("resize");
            assert_eq!(
                small.expect("not null").to_image(),
                want,
                "{}",
                paths.value(i)
            );
            let crop = decode(pngs.value(i), &DecodeOptions::default()).expect("png");
            assert_eq!((crop.width, crop.height), (16, 16));
            rows += 1;
        }
    }
    assert_eq!(rows, files.len(), "every image but broken.jpg");
    // Under on_error = fail the broken file fails the query, naming it.
    let err = r
        .run(&format!(
            "SET on_error = 'fail'; SELECT image_decode(file) FROM read_storage('{d}')"
        ))
        .await
        .expect_err("broken.jpg");
    assert!(err.to_string().contains("broken.jpg"), "{err}");
    // A bad argument is a clear error.
    let err = r
        .run(&format!(
            "SELECT image_resize(image_decode(file), 0, 5) FROM read_storage('{d}') \
             WHERE file.path = 'img00.png'"
        ))
        .await
        .expect_err("width 0");
    assert!(err.to_string().contains("image_resize"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_thumbnails_fit_their_size_and_equal_the_udf_called_directly() {
    let (dir, files) = image_dir(4);
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let d = dir.path().display();
    // Two sizes over one column are two nodes; one size twice is one.
    let batches = last_table(
        &r,
        &format!(
            "SET on_error = 'skip';
             SELECT file.path AS path, image_thumbnail(file, 20) AS t20,
                    image_thumbnail(file, 7) AS t7,
                    image_thumbnail(file, 20)['width'] AS w20
             FROM read_storage('{d}') ORDER BY path"
        ),
    )
    .await;
    let mut rows = 0;
    for b in &batches {
        let paths = b.column(0).as_string::<i32>();
        let t20 = Image::views(b.column(1).as_ref()).expect("images");
        let t7 = Image::views(b.column(2).as_ref()).expect("images");
        let w20 = b
            .column(3)
            .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
        for i in 0..b.num_rows() {
            let bytes = bytes_of(&files, paths.value(i));
            for (side, got) in [(20, t20[i]), (7, t7[i])] {
                let got = got.expect("not null").to_image();
                // 48x32 pictures: the longer side is `side`, the mode RGB.
                let height = (f64::from(side) * 2.0 / 3.0).round() as u32;
                assert_eq!(
                    (got.width, got.height),
                    (side, height),
                    "{}",
                    paths.value(i)
                );
                let dir = tempfile::tempdir().expect("dir");
                std::fs::write(dir.path().join("one"), bytes).expect("write");
                let want = udfchain::Chain::from_storage(&dir.path().display().to_string())
                    .map("t", move |f: udfchain::File| {
                        udfchain::udfs::builtins::image::image_thumbnail(f, side)
                    })
                    .collect()
                    .await
                    .expect("direct");
                let want = Image::views(want[0].column_by_name("t").expect("t").as_ref())
                    .expect("images")[0]
                    .expect("decoded")
                    .to_image();
                assert_eq!(got, want, "{} at {side}", paths.value(i));
            }
            assert_eq!(w20.value(i), 20);
            rows += 1;
        }
    }
    assert_eq!(rows, files.len(), "every image but broken.jpg");
    for (call, says) in [
        (
            "image_thumbnail(file)",
            "takes a File column and a constant max_side",
        ),
        ("image_thumbnail(file, 0)", "from 1 to 65535"),
        ("image_thumbnail(file, file.size)", "a constant max_side"),
        (
            "image_decode(file, 3)",
            "mode is 'L', 'RGB', 'RGBA' or NULL",
        ),
        (
            "image_decode(file, 'RGB', 2, 3)",
            "an optional constant mode",
        ),
        (
            "image_decode(file, 'RGB', file.size)",
            "max_side is a whole number",
        ),
    ] {
        let err = r
            .run(&format!("SELECT {call} FROM read_storage('{d}')"))
            .await
            .expect_err(call);
        assert!(err.to_string().contains(says), "{call}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_chain_decodes_with_prefetch_and_resizes_by_expression() {
    let (dir, files) = image_dir(4);
    std::fs::remove_file(dir.path().join("broken.jpg")).expect("rm");
    let batches = Session::new()
        .from_storage(&dir.path().display().to_string())
        .settings(Settings::new().prefetch(4))
        .map("img", image_decode)
        .mutate("small", resize_expr(col("img"), 12, 8, "nearest"))
        .select([col("file.path").alias("path"), col("small")])
        .collect()
        .await
        .expect("run");
    let mut seen = 0;
    for b in &batches {
        let paths = b.column(0).as_string::<i32>();
        let small = Image::views(b.column(1).as_ref()).expect("images");
        for (i, small) in small.iter().enumerate() {
            let (_, bytes) = files
                .iter()
                .find(|(n, _)| n == paths.value(i))
                .expect("file");
            let full = decode(bytes, &DecodeOptions::default()).expect("decode");
            let want = resize(full.view(), 12, 8, Filter::Nearest).expect("resize");
            assert_eq!(small.expect("row").to_image(), want);
            seen += 1;
        }
        assert!(!b.column(1).is_nullable() || b.column(1).null_count() == 0);
    }
    assert_eq!(seen, 4);
}

/// The text of a script's last table.
async fn table_text(r: &udfchain::ScriptRunner, sql: &str) -> String {
    datafusion::arrow::util::pretty::pretty_format_batches(&last_table(r, sql).await)
        .expect("format")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_under_a_convert_and_a_resize_is_one_node_with_the_same_pixels() {
    let (dir, files) = image_dir(4);
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let d = dir.path().display();
    let fused = "image_resize(image_convert(image_decode(file), 'L'), 20, 10, 'bilinear')";
    // One decode node does all three; no image_convert or image_resize is left.
    let plan = table_text(
        &r,
        &format!("EXPLAIN SELECT {fused} AS small FROM read_storage('{d}')"),
    )
    .await;
    assert!(
        plan.contains("name=image_decode[mode=L,resize=20x10/bilinear]"),
        "{plan}"
    );
    assert!(!plan.contains("image_resize("), "{plan}");
    // A resize by a column is not fused: it runs as written.
    let plan = table_text(
        &r,
        &format!(
            "EXPLAIN SELECT image_resize(image_decode(file), 20, CAST(file.size % 7 + 1 AS BIGINT)) \
             FROM read_storage('{d}')"
        ),
    )
    .await;
    assert!(plan.contains("name=image_decode,"), "{plan}");
    assert!(plan.contains("image_resize("), "{plan}");
    let batches = last_table(
        &r,
        &format!(
            "SET on_error = 'skip';
             SELECT file.path AS path, {fused} AS small,
                    image_resize_to_fit(image_decode(file, 'RGBA'), 16) AS fit
             FROM read_storage('{d}') ORDER BY path"
        ),
    )
    .await;
    let mut rows = 0;
    for b in &batches {
        let paths = b.column(0).as_string::<i32>();
        let small = Image::views(b.column(1).as_ref()).expect("images");
        let fit = Image::views(b.column(2).as_ref()).expect("images");
        for i in 0..b.num_rows() {
            let bytes = bytes_of(&files, paths.value(i));
            let natural = decode(bytes, &DecodeOptions::default()).expect("decode");
            let gray = convert(natural.view(), Mode::L).expect("convert");
            let want = resize(gray.view(), 20, 10, Filter::Bilinear).expect("resize");
            assert_eq!(small[i].expect("not null").to_image(), want);
            let rgba = convert(natural.view(), Mode::Rgba).expect("convert");
            let want = resize_to_fit(rgba.view(), 16, Filter::Bicubic).expect("fit");
            assert_eq!(fit[i].expect("not null").to_image(), want);
            rows += 1;
        }
    }
    assert_eq!(rows, files.len(), "every image but broken.jpg");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_image_pixels_refuses_larger_images_as_row_errors() {
    let (dir, files) = image_dir(4);
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let d = dir.path().display();
    // 48x32 = 1536 pixels: over a limit of 1000, each image is its row's error.
    let err = r
        .run(&format!(
            "SET max_image_pixels = 1000;
             SELECT image_thumbnail(file, 8) FROM read_storage('{d}') WHERE file.path = 'img00.png'"
        ))
        .await
        .expect_err("over the limit");
    let text = err.to_string();
    assert!(text.contains("over the limit of 1000"), "{text}");
    assert!(text.contains("img00.png"), "{text}");
    let plan = table_text(
        &r,
        &format!("EXPLAIN SELECT image_decode(file) FROM read_storage('{d}')"),
    )
    .await;
    assert!(plan.contains("image_decode[max_pixels=1000]"), "{plan}");
    let batches = last_table(
        &r,
        &format!(
            "SET on_error = 'null';
             SELECT count(*) AS n, count(image_decode(file)) AS decoded FROM read_storage('{d}')"
        ),
    )
    .await;
    let counts = batches[0]
        .column(1)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    assert_eq!(counts.value(0), 0, "no image is under 1000 pixels");
    let batches = last_table(
        &r,
        &format!(
            "SET max_image_pixels = 1536;
             SELECT count(image_decode(file)) AS decoded FROM read_storage('{d}')"
        ),
    )
    .await;
    let counts = batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    assert_eq!(
        counts.value(0) as usize,
        files.len(),
        "all at exactly the limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_decodes_a_binary_column_and_takes_a_max_side_hint() {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let png = encode(picture(48, 32, 1).view(), Format::Png, None).expect("png");
    let jpeg = encode(picture(40, 30, 2).view(), Format::Jpeg, Some(90)).expect("jpeg");
    let root = tempfile::tempdir().expect("root");
    let r = runner(root.path());
    let rows = format!(
        "SELECT 1 AS k, decode('{}', 'base64') AS content
         UNION ALL SELECT 2, decode('{}', 'base64')
         UNION ALL SELECT 3, CAST(NULL AS BYTEA)
         UNION ALL SELECT 4, decode('{}', 'base64')",
        b64(&png),
        b64(&jpeg),
        b64(b"not an image at all"),
    );
    // Bytes decode as they are; null stays null; a broken value is its
    // row's error under on_error.
    let batches = last_table(
        &r,
        &format!(
            "SET on_error = 'null';
             SELECT k, image_decode(content) AS img,
                    image_resize(image_decode(content, 'RGB'), 24, 16, 'bilinear') AS small
             FROM ({rows}) ORDER BY k"
        ),
    )
    .await;
    let b = datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches)
        .expect("one batch");
    let imgs = Image::views(b.column(1).as_ref()).expect("images");
    let smalls = Image::views(b.column(2).as_ref()).expect("images");
    for (row, bytes) in [(0, &png), (1, &jpeg)] {
        let want = decode(bytes, &DecodeOptions::default()).expect("decode");
        assert_eq!(imgs[row].expect("decoded").to_image(), want, "row {row}");
        let small = resize(want.view(), 24, 16, Filter::Bilinear).expect("resize");
        assert_eq!(smalls[row].expect("resized").to_image(), small, "row {row}");
    }
    assert!(
        imgs[2].is_none() && imgs[3].is_none(),
        "null in, and a broken value"
    );
    let plan = table_text(
        &r,
        &format!(
            "EXPLAIN SELECT image_resize(image_decode(content, 'RGB'), 24, 16, 'bilinear') \
             FROM ({rows})"
        ),
    )
    .await;
    assert!(
        plan.contains("image_decode[input=bytes,mode=RGB,resize=24x16/bilinear]"),
        "{plan}"
    );
    let err = r
        .run(&format!(
            "SET on_error = 'fail'; SELECT image_decode(content) FROM ({rows})"
        ))
        .await
        .expect_err("row 4 is no image");
    assert!(err.to_string().contains("not an image"), "{err}");
    // A column of another type is a plan error saying what it takes.
    let err = r
        .run("SELECT image_decode(k) FROM (SELECT 1 AS k)")
        .await
        .expect_err("an integer");
    assert!(
        err.to_string()
            .contains("takes a File column or a binary column"),
        "{err}"
    );

    // max_side: an 800x600 JPEG decodes at 1/4 of its size in the DCT for
    // 150 (1/8 would be under 150); a PNG keeps its size; NULL leaves a
    // part unset.
    let dir = tempfile::tempdir().expect("dir");
    let big = encode(picture(800, 600, 3).view(), Format::Jpeg, Some(90)).expect("jpeg");
    std::fs::write(dir.path().join("big.jpg"), &big).expect("write");
    std::fs::write(dir.path().join("small.png"), &png).expect("write");
    let d = dir.path().display();
    let batches = last_table(
        &r,
        &format!(
            "SELECT file.path AS path, image_decode(file, 'RGB', 150) AS hinted,
                    image_decode(file, NULL, 150) AS natural
             FROM read_storage('{d}') ORDER BY path"
        ),
    )
    .await;
    let b = datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches)
        .expect("one batch");
    let hinted = Image::views(b.column(1).as_ref()).expect("images");
    let natural = Image::views(b.column(2).as_ref()).expect("images");
    let want = decode(
        &big,
        &DecodeOptions {
            mode: Some(Mode::Rgb),
            max_side: Some(150),
            ..DecodeOptions::default()
        },
    )
    .expect("decode");
    assert_eq!((want.width, want.height), (200, 150));
    assert_eq!(hinted[0].expect("big").to_image(), want);
    assert_eq!(
        natural[0].expect("big").to_image(),
        want,
        "a JPEG's natural mode is RGB"
    );
    let small = hinted[1].expect("small").to_image();
    assert_eq!((small.width, small.height), (48, 32));
    let err = r
        .run(&format!(
            "SELECT image_decode(file, 'RGB', 0) FROM read_storage('{d}')"
        ))
        .await
        .expect_err("max_side 0");
    assert!(err.to_string().contains("max_side"), "{err}");
}
