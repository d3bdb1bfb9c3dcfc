/* An LD_PRELOAD recorder of the calls that make a save durable, for tests/engine/test_memmap_safety.cpp: fsync,
 * fdatasync, rename, renameat, renameat2 and syscall(SYS_renameat2) run as usual and, once done, append one line
 * "op path [path2] rc" to the file $TD_SYSCALL_LOG names (fds shown as the path /proc/self/fd gives). One write
 * per line with O_APPEND: lines of several threads do not interleave. Without $TD_SYSCALL_LOG nothing is
 * recorded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static void record(const char* op, const char* a, const char* b, long rc) {
  const char* log = getenv("TD_SYSCALL_LOG");
  if (log == NULL) return;
  const int saved = errno;
  char line[2 * PATH_MAX + 64];
  const int n = b ? snprintf(line, sizeof line, "%s %s %s %ld\n", op, a, b, rc)
                  : snprintf(line, sizeof line, "%s %s %ld\n", op, a, rc);
  const int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    if (n > 0) (void)!write(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
    close(fd);
  }
  errno = saved;
}

/* the path behind fd, or "fd:N" */
static void fd_path(int fd, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t r = readlink(link, out, size - 1);
  if (r < 0) {
    snprintf(out, size, "fd:%d", fd);
    return;
  }
  out[r] = 0;
}

/* a path relative to dirfd, made absolute when dirfd is a directory fd */
static void at_path(int dirfd, const char* p, char* out, size_t size) {
  if (p[0] == '/' || dirfd == AT_FDCWD) {
    snprintf(out, size, "%s", p);
    return;
  }
  char dir[PATH_MAX / 2];
  fd_path(dirfd, dir, sizeof dir);
  snprintf(out, size, "%s/%s", dir, p);
}

#define REAL(name, ret, args)    \
  static ret(*real_##name) args; \
  if (!real_##name) real_##name = (ret(*) args)dlsym(RTLD_NEXT, #name)

static int synced(const char* op, int fd, int rc) {
  char p[PATH_MAX];
  fd_path(fd, p, sizeof p);
  record(op, p, NULL, rc);
  return rc;
}

int fsync(int fd) {
  REAL(fsync, int, (int));
  return synced("fsync", fd, real_fsync(fd));
}

int fdatasync(int fd) {
  REAL(fdatasync, int, (int));
  return synced("fdatasync", fd, real_fdatasync(fd));
}

int rename(const char* from, const char* to) {
  REAL(rename, int, (const char*, const char*));
  const int rc = real_rename(from, to);
  record("rename", from, to, rc);
  return rc;
}

static void renamed(const char* op, int fd1, const char* from, int fd2, const char* to, long rc) {
  char a[PATH_MAX], b[PATH_MAX];
  at_path(fd1, from, a, sizeof a);
  at_path(fd2, to, b, sizeof b);
  record(op, a, b, rc);
}

int renameat(int fd1, const char* from, int fd2, const char* to) {
  REAL(renameat, int, (int, const char*, int, const char*));
  const int rc = real_renameat(fd1, from, fd2, to);
  renamed("renameat", fd1, from, fd2, to, rc);
  return rc;
}

int renameat2(int fd1, const char* from, int fd2, const char* to, unsigned int flags) {
  REAL(renameat2, int, (int, const char*, int, const char*, unsigned int));
  const int rc = real_renameat2(fd1, from, fd2, to, flags);
  renamed("renameat2", fd1, from, fd2, to, rc);
  return rc;
}

long syscall(long number, ...) {
  REAL(syscall, long, (long, ...));
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; ++i) a[i] = va_arg(ap, long);
  va_end(ap);
  const long rc = real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
  if (number == SYS_renameat2)
    renamed("renameat2", (int)a[0], (const char*)a[1], (int)a[2], (const char*)a[3], rc);
  else if (number == SYS_fsync)
    synced("fsync", (int)a[0], (int)rc);
  return rc;
}
