"""pgcdc's local file system for Hadoop (``jvm/``, ``pgcdc.lake.store.delta.local_file_system``):
a local session's file:// paths go through it, it sets permissions and reads link statuses as
Hadoop's own does, and it forks no process doing so."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from pgcdc.lake.store.delta import LOCAL_FS, PGCDC_JAR, connector_jars, local_file_system


def _hadoop(spark: SparkSession) -> tuple[Any, Any]:
    jvm = spark._jvm
    assert jvm is not None
    return jvm, spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]


def _fs(spark: SparkSession) -> Any:
    jvm, conf = _hadoop(spark)
    return jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)


def _path(spark: SparkSession, path: Path) -> Any:
    jvm, _ = _hadoop(spark)
    return jvm.org.apache.hadoop.fs.Path(path.as_uri())


def _last_pid() -> int:
    return int(Path("/proc/loadavg").read_text().split()[-1])


def test_a_local_session_uses_it_and_make_setup_builds_it(spark: SparkSession) -> None:
    assert any(j.name.startswith(PGCDC_JAR) for j in connector_jars()), (
        "pgcdc's jar is not in .cache/jars: run `make setup` (it builds jvm/pom.xml)"
    )
    jvm, conf = _hadoop(spark)
    fs = _fs(spark)
    assert fs.getClass().getName() == LOCAL_FS["spark.hadoop.fs.file.impl"]
    assert fs.getRaw().getClass().getName() == "dev.pgcdc.hadoop.ForklessRawLocalFileSystem"
    # a LocalFileSystem still: FileSystem.getLocal's callers (Hive, S3A's buffers) cast it
    assert jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf).getClass() == fs.getClass()
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf)
    assert (
        context.getDefaultFileSystem().getClass().getName()
        == LOCAL_FS["spark.hadoop.fs.AbstractFileSystem.file.impl"]
    )


def test_classes_set_by_the_user_are_kept() -> None:
    mine = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}
    settings = dict(mine)
    local_file_system(settings)
    assert settings == mine


@pytest.mark.parametrize("mode", [0o640, 0o600, 0o755, 0o000, 0o777])
def test_permissions_are_set_as_chmod_sets_them(
    spark: SparkSession, tmp_path: Path, mode: int
) -> None:
    jvm, _ = _hadoop(spark)
    file = tmp_path / "f"
    file.write_bytes(b"x")
    _fs(spark).setPermission(
        _path(spark, file), jvm.org.apache.hadoop.fs.permission.FsPermission(mode)
    )
    assert stat.S_IMODE(file.stat().st_mode) == mode


def test_a_sticky_folder_and_a_missing_file(spark: SparkSession, tmp_path: Path) -> None:
    jvm, _ = _hadoop(spark)
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    folder = tmp_path / "shared"
    folder.mkdir()
    # a mode java.nio cannot set: Hadoop's own code (chmod) sets it
    _fs(spark).setPermission(_path(spark, folder), permission(0o1777))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        _fs(spark).setPermission(_path(spark, tmp_path / "missing"), permission(0o644))


def test_created_files_and_folders_get_the_umask_s_permissions(
    spark: SparkSession, tmp_path: Path
) -> None:
    fs = _fs(spark)
    out = fs.create(_path(spark, tmp_path / "made" / "file"), False)
    out.write(b"abc")
    out.close()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "made" / "file").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o777 & ~umask
    # Hadoop's checksum of the file, as its LocalFileSystem writes one
    assert (tmp_path / "made" / ".file.crc").exists()


def test_link_statuses_are_hadoop_s(spark: SparkSession, tmp_path: Path) -> None:
    """The same statuses as Hadoop's own raw local file system's, for a file, a folder, a
    link (which it answers itself) and a missing path."""
    jvm, conf = _hadoop(spark)
    ours = _fs(spark).getRaw()
    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), conf)
    file = tmp_path / "file"
    file.write_bytes(b"12345")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(file)
    for name in ("file", "folder", "link"):
        path = _path(spark, tmp_path / name)
        assert ours.getFileLinkStatus(path).toString() == hadoops.getFileLinkStatus(path).toString()
    assert ours.getFileLinkStatus(_path(spark, file)).getLen() == 5
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        ours.getFileLinkStatus(_path(spark, tmp_path / "missing"))


def test_no_process_is_forked(spark: SparkSession, tmp_path: Path) -> None:
    """Hadoop's own local file system forks ``chmod`` for each permission set and ``readlink``
    for each link status (a process, and a thread reading its errors, each): 300 of each would
    take over 600 process ids; the few others the machine starts meanwhile stay far below."""
    jvm, conf = _hadoop(spark)
    fs = _fs(spark)
    context = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf)
    file = tmp_path / "f"
    file.write_bytes(b"x")
    path = _path(spark, file)
    mode = jvm.org.apache.hadoop.fs.permission.FsPermission(0o644)
    fs.getFileLinkStatus(path)  # classes loaded
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    before = _last_pid()
    for _ in range(300):
        fs.setPermission(path, mode)
        context.getFileLinkStatus(path)
    taken = (_last_pid() - before) % pid_max
    assert taken < 200, f"{taken} process ids taken by 600 calls"
