"""Python UDFs over a real S3 server on loopback (moto's server from PyPI):
listing, prefetch and ranged reads go through object_store's S3 client."""

import os
from collections.abc import Iterator

import pytest

import udfchain as uc
from conftest import sha, temp_dirs
from pathlib import Path

moto_server = pytest.importorskip("moto.server", reason="pip install 'moto[server]' (the test extra)")
boto3 = pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, dict[str, bytes]]]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
    )
    client.create_bucket(Bucket="imgs")
    data = {f"a/{i:02}.bin": os.urandom(3000 + i) for i in range(20)}
    for k, v in data.items():
        client.put_object(Bucket="imgs", Key=k, Body=v)
    yield endpoint, data
    server.stop()


def storage(endpoint: str) -> dict[str, str]:
    return {
        "endpoint": endpoint, "allow_http": "true", "region": "us-east-1",
        "access_key_id": "test", "secret_access_key": "test",
    }


def test_map_over_s3_with_prefetch(s3: tuple[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
    endpoint, data = s3

    def digest(file: uc.File) -> str:
        return sha(file.read())

    c = uc.read_storage("s3://imgs/a/").settings(storage=storage(endpoint), prefetch=8, parallel=4)
    got = c.map(h=digest).collect("file", "h")
    assert {f"a/{f.path}": h for f, h in got} == {k: sha(v) for k, v in data.items()}
    assert all(f.etag for f, _ in got)


def test_ranged_open_over_s3(s3: tuple[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
    endpoint, data = s3

    def tail(file: uc.File) -> bytes:
        with file.open() as f:
            f.seek(-16, os.SEEK_END)
            return f.read()

    c = uc.read_storage("s3://imgs/a/").settings(storage=storage(endpoint), prefetch=0)
    got = c.map(t=tail).collect("file", "t")
    assert {f"a/{f.path}": t for f, t in got} == {k: v[-16:] for k, v in data.items()}


def test_local_path_of_a_remote_file_lives_for_its_row(s3: tuple[str, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", "http://127.0.0.1:1")
    endpoint, data = s3
    seen = {}

    def probe(file: uc.File) -> str:
        path = file.get_local_path()
        with open(path, "rb") as f:
            assert f.read() == data[f"a/{file.path}"]
        seen[file.path] = path
        return sha(open(path, "rb").read())

    c = uc.read_storage("s3://imgs/a/").settings(storage=storage(endpoint), cache=False)
    # On disk in the UDF's temp dir (memory_file_limit=0), or held in memory and
    # written out when asked: either way a copy under the root, gone after its
    # row, the temp dir gone after the run.
    for limit in (0, 1 << 20):
        seen.clear()
        got = c.settings(prefetch=3, memory_file_limit=limit).map(h=probe).collect("file", "h")
        assert {f"a/{f.path}": h for f, h in got} == {k: sha(v) for k, v in data.items()}
        assert len(seen) == len(data)
        assert all(p.startswith(str(root)) for p in seen.values()), seen
        assert not any(os.path.exists(p) for p in seen.values())
        assert temp_dirs(root) == []
    # Without prefetch and cache a remote file has no copy.
    with pytest.raises(uc.UdfchainError, match="no local copy"):
        c.settings(prefetch=0).map(p=probe).collect()
