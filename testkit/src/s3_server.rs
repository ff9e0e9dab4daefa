//! A real S3 server for tests and benches: s3s + s3s-fs behind hyper on
//! 127.0.0.1, GET served by [`FastGetFs`], optionally with an added latency per
//! request ([`Latency`]) and a bandwidth cap shared by all connections, counting
//! what it serves. ETags in listings and `If-Match` are answered as S3 does; a
//! server can be stopped and restarted on the same address.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use tempfile::TempDir;
use udfchain::{Session, Settings};

/// The access key id the server accepts (with [`SECRET_KEY`]).
pub const ACCESS_KEY: &str = "udfchain-test";
/// The secret access key the server accepts (with [`ACCESS_KEY`]).
pub const SECRET_KEY: &str = "udfchain-test-secret";
/// The one bucket a server starts with (the directory [`S3Server::bucket_dir`]).
pub const BUCKET: &str = "bucket";

/// An S3 server on 127.0.0.1 serving `root/<bucket>/...` files as objects.
/// It can be stopped ([`S3Server::stop`]: connections and requests in flight
/// are cut) and started again on the same address with the same data
/// ([`S3Server::restart`]).
pub struct S3Server {
    /// `http://127.0.0.1:<port>`, the address an S3 client is given.
    pub endpoint: String,
    root: TempDir,
    addr: std::net::SocketAddr,
    service: Shaped,
    /// The runtime serving connections; `None` while stopped.
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    stats: Arc<ServerStats>,
}

/// What an [`S3Server`] served, counted in its HTTP service.
#[derive(Debug, Default)]
struct ServerStats {
    requests: AtomicUsize,
    object_gets: AtomicUsize,
    body_bytes: AtomicU64,
}

impl S3Server {
    /// A server with no added latency and no bandwidth cap.
    pub fn start() -> Self {
        Self::start_shaped(Duration::ZERO, None)
    }

    /// A server that waits `latency` before handling each request and, with
    /// `bandwidth = Some(bytes_per_s)`, sends all response bodies together at
    /// most that fast (one token bucket shared by every connection).
    pub fn start_shaped(latency: Duration, bandwidth: Option<u64>) -> Self {
        Self::start_with_latency(Latency::Constant(latency), bandwidth)
    }

    /// A server whose added latency per request follows `latency` (see
    /// [`Latency`]), with the bandwidth cap of [`S3Server::start_shaped`].
    pub fn start_with_latency(latency: Latency, bandwidth: Option<u64>) -> Self {
        let root = TempDir::new().expect("temp dir");
        std::fs::create_dir_all(root.path().join(BUCKET)).expect("bucket dir");
        let fs = FastGetFs {
            inner: s3s_fs::FileSystem::new(root.path()).expect("s3s-fs"),
            root: root.path().to_path_buf(),
            heads: Mutex::default(),
        };
        let s3 = {
            let mut b = s3s::service::S3ServiceBuilder::new(fs);
            b.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
            b.build()
        };
        let stats = Arc::new(ServerStats::default());
        let service = Shaped {
            inner: s3,
            latency: LatencySampler::new(latency),
            bucket: bandwidth.map(|b| Arc::new(TokenBucket::new(b))),
            stats: Arc::clone(&stats),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let runtime = serve(listener, service.clone());
        Self {
            endpoint: format!("http://{addr}"),
            root,
            addr,
            service,
            runtime: Mutex::new(Some(runtime)),
            stats,
        }
    }

    /// Stops serving: the listener closes (new connections are refused) and
    /// every open connection is dropped, cutting requests and bodies in flight.
    /// Returns when the port is closed. May be called from async code.
    pub fn stop(&self) {
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = runtime {
            // Dropping a runtime blocks, which a runtime thread must not do.
            std::thread::spawn(move || rt.shutdown_timeout(Duration::from_secs(5)))
                .join()
                .expect("server shutdown");
        }
    }

    /// Serves again on the same address and data after [`S3Server::stop`]
    /// (a no-op while serving).
    pub fn restart(&self) {
        let mut runtime = self.runtime.lock().unwrap_or_else(|p| p.into_inner());
        if runtime.is_some() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("rebind {}: {e}", self.addr),
            }
        };
        *runtime = Some(serve(listener, self.service.clone()));
    }

    /// HTTP requests received (any kind).
    pub fn requests(&self) -> usize {
        self.stats.requests.load(Ordering::SeqCst)
    }

    /// GETs of objects (not listings) received.
    pub fn object_gets(&self) -> usize {
        self.stats.object_gets.load(Ordering::SeqCst)
    }

    /// Response body bytes sent.
    pub fn body_bytes(&self) -> u64 {
        self.stats.body_bytes.load(Ordering::SeqCst)
    }

    /// The root dir: the bucket dir and s3s-fs's metadata files.
    pub fn root_dir(&self) -> &FsPath {
        self.root.path()
    }

    /// The directory whose files are the bucket's objects.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.path().join(BUCKET)
    }

    /// Settings that make `s3://bucket` reach this server.
    pub fn settings(&self) -> Settings {
        Settings::new()
            .storage_option("endpoint", &self.endpoint)
            .storage_option("allow_http", "true")
            .storage_option("access_key_id", ACCESS_KEY)
            .storage_option("secret_access_key", SECRET_KEY)
            .storage_option("region", "us-east-1")
            .storage_option("virtual_hosted_style_request", "false")
    }

    /// A session whose `s3://bucket` is this server.
    pub fn session(&self) -> Arc<Session> {
        Session::with_settings(self.settings())
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let runtime = self
            .runtime
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(rt) = runtime {
            rt.shutdown_background();
        }
    }
}

/// A runtime accepting connections on `listener` and serving `service`.
fn serve(listener: std::net::TcpListener, service: Shaped) -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("s3-test-server")
        .enable_all()
        .build()
        .expect("server runtime");
    listener.set_nonblocking(true).expect("nonblocking");
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        let http = ConnBuilder::new(TokioExecutor::new());
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let _ = socket.set_nodelay(true);
            let conn = http
                .serve_connection(TokioIo::new(socket), service.clone())
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    runtime
}

/// s3s-fs with two changes. ETags: an object's ETag is `"<inode>-<mtime
/// ns>-<size>"` (hex) of its file, the same in LIST, HEAD and GET responses, so
/// a listing carries ETags as S3's does (s3s-fs lists none), and `If-Match` on
/// GET and HEAD is answered as S3 does: 412 PreconditionFailed unless it names
/// the current ETag (`*` matches any). A file rewritten in place within one
/// mtime tick at the same size keeps its ETag: tests rewrite by renaming a new
/// file over the old one. And: GET opens, stats and reads the first
/// [`FastGetFs::CHUNK`] of the object in one blocking call (then one per chunk),
/// and takes the ETag, attributes and checksums from s3s-fs's HEAD, kept per
/// path while the file's size and mtime stay the same. s3s-fs streams a body
/// through tokio's `File` in 4 KiB reads and reads two metadata files, one
/// blocking-pool round trip each: ≈0.6 ms of server CPU per 64 KiB GET, spent on
/// the cores the client under test uses (`perf` in the A workload: the server's
/// threads took two thirds of the process's CPU). Errors (no such key or
/// bucket) and every other operation are s3s-fs's.
struct FastGetFs {
    inner: s3s_fs::FileSystem,
    root: PathBuf,
    heads: Mutex<HashMap<PathBuf, (u64, std::time::SystemTime, s3s::dto::HeadObjectOutput)>>,
}

/// An object opened for a GET: its size and mtime, the byte range to send and
/// its first chunk.
struct Opened {
    file: std::fs::File,
    len: u64,
    modified: std::time::SystemTime,
    e_tag: String,
    range: Range<u64>,
    first: Bytes,
}

/// The ETag value (unquoted) of a file: `<inode>-<mtime ns>-<size>` in hex.
fn stat_e_tag(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let mtime = (meta.mtime() as i128) * 1_000_000_000 + meta.mtime_nsec() as i128;
    format!("{:x}-{mtime:x}-{:x}", meta.ino(), meta.len())
}

/// 412 PreconditionFailed unless `condition` (an `If-Match`) names `e_tag`.
fn check_if_match(condition: Option<&s3s::dto::ETagCondition>, e_tag: &str) -> s3s::S3Result<()> {
    match condition {
        Some(s3s::dto::ETagCondition::ETag(want)) if want.value() != e_tag => Err(s3s::s3_error!(
            PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold"
        )),
        _ => Ok(()),
    }
}

/// The file of `key` in `bucket`, refusing keys that leave the bucket.
fn object_file(root: &FsPath, bucket: &str, key: &str) -> s3s::S3Result<PathBuf> {
    let key = FsPath::new(key);
    if key
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(s3s::s3_error!(InvalidArgument, "key escapes the bucket"));
    }
    Ok(root.join(bucket).join(key))
}

impl FastGetFs {
    const CHUNK: u64 = 256 << 10;

    fn open(
        path: &FsPath,
        range: Option<s3s::dto::Range>,
        if_match: Option<&s3s::dto::ETagCondition>,
    ) -> std::io::Result<s3s::S3Result<Opened>> {
        let mut file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        let len = meta.len();
        let e_tag = stat_e_tag(&meta);
        // S3 evaluates If-Match before the range.
        if let Err(e) = check_if_match(if_match, &e_tag) {
            return Ok(Err(e));
        }
        let range = match range.map(|r| r.check(len)) {
            None => 0..len,
            Some(Ok(r)) => r,
            Some(Err(e)) => return Ok(Err(e.into())),
        };
        let n = (range.end - range.start).min(Self::CHUNK);
        let first = Self::read_at(&mut file, range.start, n)?;
        Ok(Ok(Opened {
            file,
            len,
            modified: meta.modified()?,
            e_tag,
            range,
            first,
        }))
    }

    fn read_at(file: &mut std::fs::File, pos: u64, len: u64) -> std::io::Result<Bytes> {
        use std::io::{Read, Seek, SeekFrom};
        file.seek(SeekFrom::Start(pos))?;
        let mut buf = vec![0; len as usize];
        file.read_exact(&mut buf)?;
        Ok(Bytes::from(buf))
    }

    /// s3s-fs's HEAD of the object, from `heads` while size and mtime match.
    async fn head(
        &self,
        req: s3s::S3Request<s3s::dto::GetObjectInput>,
        path: &FsPath,
        opened: &Opened,
    ) -> s3s::S3Result<s3s::dto::HeadObjectOutput> {
        use s3s::S3 as _;
        let heads = || self.heads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((len, modified, head)) = heads().get(path)
            && (*len, *modified) == (opened.len, opened.modified)
        {
            return Ok(head.clone());
        }
        let head = self
            .inner
            .head_object(req.map_input(|i| s3s::dto::HeadObjectInput {
                bucket: i.bucket,
                key: i.key,
                ..Default::default()
            }))
            .await?
            .output;
        heads().insert(
            path.to_path_buf(),
            (opened.len, opened.modified, head.clone()),
        );
        Ok(head)
    }
}

/// The [`s3s::S3`] impl of [`FastGetFs`]: `get_object` is its own,
/// `head_object` and `list_objects_v2` are s3s-fs's with our ETags (and
/// `If-Match` on HEAD), the listed operations are s3s-fs's (all that s3s-fs
/// implements).
macro_rules! fast_get_fs_s3 {
    ($($op:ident: $input:ident => $output:ident;)*) => {
        #[async_trait]
        impl s3s::S3 for FastGetFs {
            $(
                async fn $op(
                    &self,
                    req: s3s::S3Request<s3s::dto::$input>,
                ) -> s3s::S3Result<s3s::S3Response<s3s::dto::$output>> {
                    self.inner.$op(req).await
                }
            )*

            async fn head_object(
                &self,
                req: s3s::S3Request<s3s::dto::HeadObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::HeadObjectOutput>> {
                let path = object_file(&self.root, &req.input.bucket, &req.input.key)?;
                let if_match = req.input.if_match.clone();
                let mut resp = self.inner.head_object(req).await?;
                let meta = tokio::fs::metadata(&path)
                    .await
                    .map_err(|e| s3s::s3_error!(e, NoSuchKey))?;
                let e_tag = stat_e_tag(&meta);
                check_if_match(if_match.as_ref(), &e_tag)?;
                resp.output.e_tag = Some(s3s::dto::ETag::Strong(e_tag));
                Ok(resp)
            }

            async fn list_objects_v2(
                &self,
                req: s3s::S3Request<s3s::dto::ListObjectsV2Input>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::ListObjectsV2Output>> {
                let dir = self.root.join(&req.input.bucket);
                let mut resp = self.inner.list_objects_v2(req).await?;
                let Some(mut objects) = resp.output.contents.take() else {
                    return Ok(resp);
                };
                let objects = tokio::task::spawn_blocking(move || {
                    for o in &mut objects {
                        let meta = o.key.as_deref().map(|k| std::fs::metadata(dir.join(k)));
                        if let Some(Ok(meta)) = meta {
                            o.e_tag = Some(s3s::dto::ETag::Strong(stat_e_tag(&meta)));
                        }
                    }
                    objects
                })
                .await
                .map_err(|e| s3s::s3_error!(e, InternalError))?;
                resp.output.contents = Some(objects);
                Ok(resp)
            }

            async fn get_object(
                &self,
                req: s3s::S3Request<s3s::dto::GetObjectInput>,
            ) -> s3s::S3Result<s3s::S3Response<s3s::dto::GetObjectOutput>> {
                let path = object_file(&self.root, &req.input.bucket, &req.input.key)?;
                let requested_range = req.input.range;
                let opened = {
                    let (path, if_match) = (path.clone(), req.input.if_match.clone());
                    tokio::task::spawn_blocking(move || {
                        Self::open(&path, requested_range, if_match.as_ref())
                    })
                        .await
                        .map_err(|e| s3s::s3_error!(e, InternalError))?
                };
                let opened = match opened {
                    Ok(opened) => opened?,
                    // s3s-fs tells a missing key from a missing bucket.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return self.inner.get_object(req).await;
                    }
                    Err(e) => return Err(s3s::s3_error!(e, InternalError)),
                };
                let head = self.head(req, &path, &opened).await?;
                let Opened { file, len, range, first, e_tag, .. } = opened;
                let whole = range.end - range.start == len;
                // A ranged GET is answered 206 with Content-Range, even for all bytes.
                let content_range = requested_range
                    .is_some()
                    .then(|| format!("bytes {}-{}/{len}", range.start, range.end - 1));
                let (start, end) = (range.start + first.len() as u64, range.end);
                let rest = futures::stream::try_unfold((file, start), move |(mut file, pos)| async move {
                    if pos >= end {
                        return Ok(None);
                    }
                    let n = (end - pos).min(Self::CHUNK);
                    let (file, bytes) = tokio::task::spawn_blocking(move || {
                        Self::read_at(&mut file, pos, n).map(|b| (file, b))
                    })
                    .await
                    .map_err(std::io::Error::other)??;
                    Ok::<_, std::io::Error>(Some((bytes, (file, pos + n))))
                });
                let body = futures::stream::once(async move { Ok(first) }).chain(rest);
                let output = s3s::dto::GetObjectOutput {
                    body: Some(s3s::dto::StreamingBlob::wrap(body)),
                    content_length: Some((range.end - range.start) as i64),
                    content_range,
                    last_modified: head.last_modified,
                    metadata: head.metadata,
                    content_encoding: head.content_encoding,
                    content_type: head.content_type,
                    content_disposition: head.content_disposition,
                    content_language: head.content_language,
                    cache_control: head.cache_control,
                    expires: head.expires,
                    website_redirect_location: head.website_redirect_location,
                    e_tag: Some(s3s::dto::ETag::Strong(e_tag)),
                    // S3 sends checksums only with the whole object.
                    checksum_crc32: head.checksum_crc32.filter(|_| whole),
                    checksum_crc32c: head.checksum_crc32c.filter(|_| whole),
                    checksum_sha1: head.checksum_sha1.filter(|_| whole),
                    checksum_sha256: head.checksum_sha256.filter(|_| whole),
                    checksum_crc64nvme: head.checksum_crc64nvme.filter(|_| whole),
                    ..Default::default()
                };
                Ok(s3s::S3Response::new(output))
            }
        }
    };
}

fast_get_fs_s3! {
    abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
    complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
    copy_object: CopyObjectInput => CopyObjectOutput;
    create_bucket: CreateBucketInput => CreateBucketOutput;
    create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
    delete_bucket: DeleteBucketInput => DeleteBucketOutput;
    delete_object: DeleteObjectInput => DeleteObjectOutput;
    delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
    get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
    head_bucket: HeadBucketInput => HeadBucketOutput;
    list_buckets: ListBucketsInput => ListBucketsOutput;
    list_objects: ListObjectsInput => ListObjectsOutput;
    list_parts: ListPartsInput => ListPartsOutput;
    put_object: PutObjectInput => PutObjectOutput;
    upload_part: UploadPartInput => UploadPartOutput;
    upload_part_copy: UploadPartCopyInput => UploadPartCopyOutput;
}

/// The s3s service with an added latency per request and a shared bandwidth cap
/// on response bodies, counting what it serves.
#[derive(Clone)]
struct Shaped {
    inner: s3s::service::S3Service,
    latency: LatencySampler,
    bucket: Option<Arc<TokenBucket>>,
    stats: Arc<ServerStats>,
}

type ShapedFuture = Pin<
    Box<dyn Future<Output = Result<http::Response<ShapedBody>, s3s::HttpError>> + Send + 'static>,
>;

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Shaped {
    type Response = http::Response<ShapedBody>;
    type Error = s3s::HttpError;
    type Future = ShapedFuture;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        self.stats.requests.fetch_add(1, Ordering::SeqCst);
        // Path-style: `/bucket/key` is an object, `/bucket?list-type=2` a listing.
        let is_object = req.uri().path().trim_matches('/').contains('/');
        if req.method() == http::Method::GET && is_object {
            self.stats.object_gets.fetch_add(1, Ordering::SeqCst);
        }
        let this = self.clone();
        Box::pin(async move {
            let latency = this.latency.next();
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let resp = hyper::service::Service::call(&this.inner, req).await?;
            Ok(resp.map(|body| ShapedBody {
                inner: Box::pin(body),
                bucket: this.bucket.clone(),
                stats: Arc::clone(&this.stats),
                held: None,
            }))
        })
    }
}

/// One token bucket (in virtual time) shared by all connections: a frame of
/// `n` bytes may leave once the bytes before it have drained at `rate`.
struct TokenBucket {
    bytes_per_s: f64,
    /// When the bytes reserved so far have drained.
    next: Mutex<Instant>,
}

impl TokenBucket {
    /// Idle time that may be made up by a burst.
    const BURST: Duration = Duration::from_millis(5);

    fn new(bytes_per_s: u64) -> Self {
        Self {
            bytes_per_s: bytes_per_s.max(1) as f64,
            next: Mutex::new(Instant::now()),
        }
    }

    /// Reserves `n` bytes; returns how long to wait before sending them.
    fn take(&self, n: usize) -> Duration {
        let now = Instant::now();
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let floor = now.checked_sub(Self::BURST).unwrap_or(now);
        let start = (*next).max(floor);
        *next = start + Duration::from_secs_f64(n as f64 / self.bytes_per_s);
        next.saturating_duration_since(now)
    }
}

/// A response body whose data frames pass through the [`TokenBucket`].
struct ShapedBody {
    inner: Pin<Box<s3s::Body>>,
    bucket: Option<Arc<TokenBucket>>,
    stats: Arc<ServerStats>,
    /// A frame waiting for its turn.
    held: Option<(http_body::Frame<Bytes>, Pin<Box<tokio::time::Sleep>>)>,
}

impl http_body::Body for ShapedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some((_, sleep)) = &mut this.held {
                std::task::ready!(sleep.as_mut().poll(cx));
                if let Some((frame, _)) = this.held.take() {
                    return Poll::Ready(Some(Ok(frame)));
                }
            }
            let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
            let Some(Ok(frame)) = frame else {
                return Poll::Ready(frame);
            };
            let n = frame.data_ref().map_or(0, |d| d.len());
            this.stats.body_bytes.fetch_add(n as u64, Ordering::SeqCst);
            let wait = match &this.bucket {
                Some(bucket) if n > 0 => bucket.take(n),
                _ => Duration::ZERO,
            };
            if wait.is_zero() {
                return Poll::Ready(Some(Ok(frame)));
            }
            this.held = Some((frame, Box::pin(tokio::time::sleep(wait))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let mut hint = self.inner.size_hint();
        let held = self
            .held
            .as_ref()
            .and_then(|(f, _)| f.data_ref())
            .map_or(0, |d| d.len() as u64);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + held);
        }
        hint.set_lower(hint.lower() + held);
        hint
    }
}

/// How long the test server waits before handling each request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// The same delay for every request.
    Constant(Duration),
    /// Object stores as users meet them: a lognormal delay with this median and
    /// 99th percentile, plus a stall of `stall` for one request in `stall_every`
    /// (drawn independently). Seeded: one seed gives one sequence of delays.
    Tail {
        /// The median delay.
        median: Duration,
        /// The 99th percentile of the lognormal delay.
        p99: Duration,
        /// The delay of a stalled request.
        stall: Duration,
        /// One request in this many stalls (0: none).
        stall_every: u32,
        /// The seed of the draws.
        seed: u64,
    },
}

impl Latency {
    /// p50 20 ms, p99 150 ms, a 1 s stall for one request in 500.
    pub fn object_store_tail(seed: u64) -> Self {
        Self::Tail {
            median: Duration::from_millis(20),
            p99: Duration::from_millis(150),
            stall: Duration::from_secs(1),
            stall_every: 500,
            seed,
        }
    }

    /// The name records carry: `constant` or `tail`.
    pub fn model(&self) -> &'static str {
        match self {
            Self::Constant(_) => "constant",
            Self::Tail { .. } => "tail",
        }
    }
}

/// Draws the delays of a [`Latency`] (one generator shared by all connections;
/// also the GET delays of a `GeneratedStore`).
#[derive(Clone)]
pub(crate) struct LatencySampler {
    model: Latency,
    state: Arc<Mutex<u64>>,
}

impl LatencySampler {
    pub(crate) fn new(model: Latency) -> Self {
        let seed = match model {
            Latency::Tail { seed, .. } => seed,
            Latency::Constant(_) => 0,
        };
        Self {
            model,
            // xorshift needs a non-zero state.
            state: Arc::new(Mutex::new(seed ^ 0x9E37_79B9_7F4A_7C15)),
        }
    }

    /// A uniform draw in (0, 1].
    fn uniform(&self) -> f64 {
        let mut s = self.state.lock().expect("latency state");
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        ((*s >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    pub(crate) fn next(&self) -> Duration {
        match self.model {
            Latency::Constant(d) => d,
            Latency::Tail {
                median,
                p99,
                stall,
                stall_every,
                ..
            } => {
                if stall_every > 0 && self.uniform() * f64::from(stall_every) <= 1.0 {
                    return stall;
                }
                // Lognormal: ln(delay) ~ N(ln(median), sigma), p99 at z = 2.326.
                let median_s = median.as_secs_f64().max(1e-6);
                let sigma = (p99.as_secs_f64().max(median_s) / median_s).ln() / 2.326;
                let z = (-2.0 * self.uniform().ln()).sqrt()
                    * (2.0 * std::f64::consts::PI * self.uniform()).cos();
                Duration::from_secs_f64(median_s * (sigma * z).exp())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_latency_model_has_its_median_p99_and_stalls() {
        let sampler = LatencySampler::new(Latency::object_store_tail(7));
        let mut draws: Vec<Duration> = (0..100_000).map(|_| sampler.next()).collect();
        let stalls = draws
            .iter()
            .filter(|d| **d == Duration::from_secs(1))
            .count();
        draws.sort();
        let at = |q: f64| draws[(q * draws.len() as f64) as usize].as_secs_f64() * 1e3;
        // A stall is 1 in 500: 200 of 100,000, within sampling noise.
        assert!((120..=280).contains(&stalls), "{stalls} stalls");
        assert!((18.0..22.0).contains(&at(0.5)), "p50 {} ms", at(0.5));
        // The stalls sit above p99 and push it up a little.
        assert!((135.0..190.0).contains(&at(0.99)), "p99 {} ms", at(0.99));
        // One seed, one sequence.
        let (a, b) = (
            LatencySampler::new(Latency::object_store_tail(7)),
            LatencySampler::new(Latency::object_store_tail(7)),
        );
        assert!((0..100).all(|_| a.next() == b.next()));
    }
}
