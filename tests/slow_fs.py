"""A FUSE file system for tests: SOURCE mirrored read-only at MOUNTPOINT,
except that a read of a file whose name is listed in the file CONTROL waits
until the name is gone from it (a stalled network file system, as one
client sees it). Runs in the foreground until unmounted.

    /usr/bin/python3 tests/slow_fs.py SOURCE MOUNTPOINT CONTROL
"""

import errno
import os
import sys
import time

from fusepy import FUSE, FuseOSError, Operations


class SlowFs(Operations):
    def __init__(self, source, control):
        self.source = source
        self.control = control

    def _path(self, path):
        return os.path.join(self.source, path.lstrip("/"))

    def _stalled(self, path):
        try:
            with open(self.control) as f:
                return os.path.basename(path) in f.read().split()
        except OSError:
            return False

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._path(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime",
                                            "st_nlink", "st_size", "st_uid")}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._path(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        return os.open(self._path(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        while self._stalled(path):
            time.sleep(0.05)
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)


if __name__ == "__main__":
    source, mountpoint, control = sys.argv[1:4]
    FUSE(SlowFs(source, control), mountpoint, foreground=True, ro=True, nothreads=False,
         direct_io=True)
