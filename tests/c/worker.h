/*
 * worker.h — a real worker process for the plain-C tests: the `colocated`
 * executable (COLOCATED_WORKER_BIN, set by the Makefile) started as
 * `colocated worker` on 127.0.0.1 with a fresh token, and a client
 * connected to it. Include after harness.h and helpers.h.
 */
#ifndef COLOCATED_TEST_WORKER_H
#define COLOCATED_TEST_WORKER_H

#include <fcntl.h>
#include <signal.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#ifndef COLOCATED_WORKER_BIN
#error "build with -DCOLOCATED_WORKER_BIN='\"path of the colocated executable\"' (see the Makefile)"
#endif

/* A worker process, and what it was started with. */
typedef struct {
  pid_t pid;
  char token[65];
  char token_file[64];
  char out_file[64];
  char address[64];
} test_worker;

/* A temporary file only this user reads, holding `text`; its path in `path`. */
static inline void worker_temp_file(char path[64], const char *text) {
  snprintf(path, 64, "/tmp/colocated-c-worker-XXXXXX");
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  size_t n = strlen(text);
  CHECK(write(fd, text, n) == (ssize_t)n);
  close(fd);
}

/* Starts `colocated worker` on 127.0.0.1 (an ephemeral port) with `devices`
 * CPU devices, a fresh token and, unless NULL, the plugin library `plugin`,
 * and waits for its `listening on HOST:PORT` line (at most 20 s). */
static inline void start_test_worker(test_worker *w, int devices, const char *plugin) {
  unsigned char bytes[32];
  FILE *random = fopen("/dev/urandom", "rb");
  CHECK(random != NULL);
  CHECK(fread(bytes, 1, sizeof bytes, random) == sizeof bytes);
  fclose(random);
  for (size_t i = 0; i < sizeof bytes; ++i) snprintf(w->token + 2 * i, 3, "%02x", bytes[i]);
  worker_temp_file(w->token_file, w->token);
  worker_temp_file(w->out_file, "");
  char count[16];
  snprintf(count, sizeof count, "%d", devices);
  fflush(NULL);
  w->pid = fork();
  CHECK(w->pid >= 0);
  if (w->pid == 0) {
#ifdef __linux__
    /* The worker ends with this test's process, even one that crashed
     * (or that ended before this line ran). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(127);
#endif
    int out = open(w->out_file, O_WRONLY | O_TRUNC);
    if (out < 0 || dup2(out, STDOUT_FILENO) < 0) _exit(127);
    if (plugin == NULL) {
      execl(COLOCATED_WORKER_BIN, "colocated", "worker", "--listen", "127.0.0.1:0", "--cpu-devices", count,
            "--token-file", w->token_file, (char *)NULL);
    } else {
      execl(COLOCATED_WORKER_BIN, "colocated", "worker", "--listen", "127.0.0.1:0", "--cpu-devices", count,
            "--token-file", w->token_file, "--plugin", plugin, (char *)NULL);
    }
    _exit(127);
  }
  /* Once it listens it has read its token file, and its output needs no
   * name: neither file stays, whatever happens next. */
  for (int i = 0; i < 2000; ++i) {
    FILE *f = fopen(w->out_file, "r");
    char line[128] = {0};
    bool got = f != NULL && fgets(line, sizeof line, f) != NULL && strchr(line, '\n') != NULL;
    if (f != NULL) fclose(f);
    int status = 0;
    bool exited = !got && waitpid(w->pid, &status, WNOHANG) == w->pid;
    if (got || exited || i == 1999) {
      unlink(w->token_file);
      unlink(w->out_file);
    }
    if (got) {
      CHECK(sscanf(line, "listening on %63s", w->address) == 1);
      return;
    }
    if (exited) FAIL("the worker exited before listening (%d)", status);
    harness_sleep_ms(10);
  }
  FAIL("the worker did not say where it listens within 20 s");
}

/* Stops the worker (SIGTERM, then SIGKILL after 10 s). */
static inline void stop_test_worker(test_worker *w) {
  kill(w->pid, SIGTERM);
  int status;
  int i = 0;
  for (; i < 1000 && waitpid(w->pid, &status, WNOHANG) == 0; ++i) harness_sleep_ms(10);
  if (i == 1000) {
    kill(w->pid, SIGKILL);
    waitpid(w->pid, &status, 0);
  }
}

/* A client of the worker's devices alone (host 0 is the worker). */
static inline colocated_client *connect_to_worker(const test_worker *w) {
  colocated_string_view address = sv(w->address);
  colocated_connect_options o = {sizeof o};
  o.workers = &address;
  o.num_workers = 1;
  o.token = sv(w->token);
  o.timeout_ms = 20000;
  o.executor_threads = 2;
  colocated_client *client = NULL;
  CHECK_OK(colocated_client_connect(&o, &client));
  return client;
}

#endif
