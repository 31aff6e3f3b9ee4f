/*
 * fogshift: the local file system of every node's Spark session (fogshift/runtime/jvm_classes.py).
 *
 * Hadoop's local file system sets a file's permissions when it creates it, and without Hadoop's
 * native library (none is published for this platform) it does so by starting a `chmod`
 * process. A streaming query writes an offsets file, a commit file and a state changelog, each
 * with a checksum file beside it, every micro-batch: 4 to 8 processes forked from the JVM per
 * batch, each with a thread reading its output. This file system is Hadoop's checksummed local
 * one with permissions set through java.nio instead. Nothing else differs.
 */
package fogshift.hadoop;

import static java.nio.file.attribute.PosixFilePermission.GROUP_EXECUTE;
import static java.nio.file.attribute.PosixFilePermission.GROUP_READ;
import static java.nio.file.attribute.PosixFilePermission.GROUP_WRITE;
import static java.nio.file.attribute.PosixFilePermission.OTHERS_EXECUTE;
import static java.nio.file.attribute.PosixFilePermission.OTHERS_READ;
import static java.nio.file.attribute.PosixFilePermission.OTHERS_WRITE;
import static java.nio.file.attribute.PosixFilePermission.OWNER_EXECUTE;
import static java.nio.file.attribute.PosixFilePermission.OWNER_READ;
import static java.nio.file.attribute.PosixFilePermission.OWNER_WRITE;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/** Hadoop's {@code LocalFileSystem} (checksums included) over {@link Raw}. */
public final class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** Hadoop's raw local file system, setting permissions without a process. */
  public static final class Raw extends RawLocalFileSystem {
    /**
     * The nine rwx bits of {@code permission}, as `chmod` would set them (the sticky bit, which
     * no checkpoint file has, is not set).
     */
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission.toShort()));
    }
  }

  /** Bit i of a mode, lowest first. */
  private static final PosixFilePermission[] BITS = {
    OTHERS_EXECUTE, OTHERS_WRITE, OTHERS_READ,
    GROUP_EXECUTE, GROUP_WRITE, GROUP_READ,
    OWNER_EXECUTE, OWNER_WRITE, OWNER_READ,
  };

  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << i)) != 0) {
        set.add(BITS[i]);
      }
    }
    return set;
  }
}
