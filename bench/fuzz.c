/* bench/fuzz.c: long campaigns of the differential fuzzer (tests/fuzz_program.h), which the CI
 * slice (tests/test_fuzz.c) runs only a few hundred programs of.
 *
 *   build/bench/fuzz [--programs N] [--start S] [--minutes M] [--jobs J] [--log FILE] [--dynamic]
 *   build/bench/fuzz --only SEED
 *
 * Programs S .. S+N-1 (default 0 .. 99999) are checked in batches of 50, each batch in a child
 * process, J at a time (default 2): a crash or an abort in generated code kills only its batch,
 * which is then re-run one program per process to name the program that crashed. A batch that
 * runs past 5 minutes is killed the same way (a hang). Every failure (mismatch, crash, hang, or
 * a program eager rejected) is appended to the log (default fuzz-failures.log) with its seed,
 * configuration and program text; --only SEED checks one program in this process and prints
 * it. --dynamic checks each program at changing sizes through one compiled function instead
 * (fz_check_dynamic: dynamic shapes, every size compiled at its first call). Progress goes to
 * stderr every 30 s; the last line is the summary:
 *   fuzz: 100000 programs in 41.2 min: 0 mismatches, 0 crashes, 0 hangs, 0 rejected by eager */
#define _POSIX_C_SOURCE 200809L /* fork, kill, fdopen */
#include "bench.h"
#include "../tests/fuzz_program.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

enum { BATCH = 50, HANG_S = 300, MAX_JOBS = 16 };

typedef struct job {
  pid_t pid;
  uint64_t first, n;
  int fd;        /* the child's report: "programs failures skipped" */
  double start;
} job;

static const char *log_path = "fuzz-failures.log";
static bool dynamic; /* --dynamic */

/* Checks programs [first, first + n) in this process, failures appended to the log; writes the
 * counts to fd. */
static void run_batch(uint64_t first, uint64_t n, int fd) {
  FILE *log = fopen(log_path, "a");
  if (!log) log = stderr;
  setvbuf(log, NULL, _IOLBF, 0);
  long fails = 0, skipped = 0;
  for (uint64_t s = first; s < first + n; s++) {
    bool skip;
    fails += (dynamic ? fz_check_dynamic(s, log, &skip) : fz_check(s, ~0u, log, &skip)) > 0;
    skipped += skip;
  }
  dprintf(fd, "%llu %ld %ld\n", (unsigned long long)n, fails, skipped);
}

static pid_t spawn(uint64_t first, uint64_t n, int *fd) {
  int p[2];
  if (pipe(p)) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    run_batch(first, n, p[1]);
    _exit(0);
  }
  close(p[1]);
  *fd = p[0];
  return pid;
}

/* Waits for a one-program child; returns its signal (0: it finished), -1 on a hang. */
static int run_alone(uint64_t seed, long *fails, long *skipped) {
  int fd;
  pid_t pid = spawn(seed, 1, &fd);
  if (pid < 0) return 0;
  double t0 = bench_now();
  int st = 0, hang = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (bench_now() - t0 > HANG_S) {
      kill(pid, SIGKILL), waitpid(pid, &st, 0), hang = 1;
      break;
    }
    usleep(10000);
  }
  char line[128] = "";
  ssize_t k = read(fd, line, sizeof line - 1);
  close(fd);
  if (k > 0) {
    line[k] = 0;
    unsigned long long n;
    long f, s;
    if (sscanf(line, "%llu %ld %ld", &n, &f, &s) == 3) *fails += f, *skipped += s;
  }
  if (hang) return -1;
  return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

/* The program's text, made in a child (the program may crash the process that builds it). */
static void log_program(uint64_t seed, const char *what) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    FILE *log = fopen(log_path, "a");
    if (!log) _exit(1);
    fz_program t = {.seed = seed, .n_ops = 4 + (int)(seed % 27), .cap = 1};
    fprintf(log, "program %llu: %s\n", (unsigned long long)seed, what);
    fflush(log);
    em_scope_begin();
    fz_inputs x;
    if (fz_make_inputs(seed, 0, false, false, 0, false, &x)) fz_model(&t, x.in, x.n);
    fprintf(log, "%s", t.text ? t.text : "(no text)\n");
    fclose(log);
    _exit(0);
  }
  int st;
  if (pid > 0) waitpid(pid, &st, 0);
}

int main(int argc, char **argv) {
  bench_init("fuzz", argc, argv);
  uint64_t first = 0, n = 100000;
  double minutes = 1e9;
  int jobs = 2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--only") && v) {
      bool skip;
      int f = fz_check(strtoull(v, NULL, 10), ~0u, stdout, &skip);
      printf("program %s: %s\n", v, skip ? "rejected by eager" : f ? "FAILED" : "agrees with eager on every configuration");
      return f || skip;
    }
    if (!strcmp(a, "--programs") && v) n = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--start") && v) first = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--minutes") && v) minutes = atof(v), i++;
    else if (!strcmp(a, "--jobs") && v) jobs = atoi(v), i++;
    else if (!strcmp(a, "--log") && v) log_path = v, i++;
    else if (!strcmp(a, "--dynamic")) dynamic = true, setenv("EMBER_DYNAMIC_COMPILE_AFTER", "1", 0);
    else if (strcmp(a, "--json")) {
      fprintf(stderr, "usage: fuzz [--programs N] [--start S] [--minutes M] [--jobs J] [--log FILE] [--dynamic] | --only SEED\n");
      return 2;
    }
  }
  if (jobs < 1) jobs = 1;
  if (jobs > MAX_JOBS) jobs = MAX_JOBS;
  job running[MAX_JOBS];
  int n_run = 0;
  uint64_t next = first, end = first + n, done = 0;
  long fails = 0, skipped = 0, crashes = 0, hangs = 0;
  double t0 = bench_now(), last_report = t0;
  while (n_run > 0 || (next < end && bench_now() - t0 < 60 * minutes)) {
    while (n_run < jobs && next < end && bench_now() - t0 < 60 * minutes) {
      job *j = &running[n_run];
      j->first = next, j->n = end - next < BATCH ? end - next : BATCH, j->start = bench_now();
      j->pid = spawn(j->first, j->n, &j->fd);
      if (j->pid < 0) {
        fprintf(stderr, "fuzz: fork: %s\n", strerror(errno));
        return 1;
      }
      next += j->n, n_run++;
    }
    for (int k = 0; k < n_run; k++) {
      job *j = &running[k];
      int st = 0;
      pid_t w = waitpid(j->pid, &st, WNOHANG);
      bool hung = w == 0 && bench_now() - j->start > HANG_S;
      if (w == 0 && !hung) continue;
      if (hung) kill(j->pid, SIGKILL), waitpid(j->pid, &st, 0);
      char line[128] = "";
      ssize_t got = read(j->fd, line, sizeof line - 1);
      close(j->fd);
      unsigned long long m = 0;
      long f = 0, s = 0;
      if (!hung && WIFEXITED(st) && got > 0 && (line[got] = 0, sscanf(line, "%llu %ld %ld", &m, &f, &s) == 3)) {
        fails += f, skipped += s;
      } else { /* a crash or a hang: find the program, one per process */
        for (uint64_t p = j->first; p < j->first + j->n; p++) {
          int sig = run_alone(p, &fails, &skipped);
          if (!sig) continue;
          char what[64];
          snprintf(what, sizeof what, sig < 0 ? "hang (over %d s)" : "crash (signal %d)", sig < 0 ? HANG_S : sig);
          log_program(p, what);
          sig < 0 ? hangs++ : crashes++;
        }
      }
      done += j->n;
      running[k--] = running[--n_run];
    }
    if (bench_now() - last_report > 30) {
      last_report = bench_now();
      fprintf(stderr, "fuzz: %llu programs, %.1f/s, %ld mismatches, %ld crashes, %ld hangs, %ld rejected\n",
              (unsigned long long)done, done / (last_report - t0), fails, crashes, hangs, skipped);
    }
    usleep(20000);
  }
  printf("fuzz: %llu programs (seeds %llu..%llu) in %.1f min: %ld mismatches, %ld crashes, %ld hangs, %ld rejected by eager\n",
         (unsigned long long)done, (unsigned long long)first, (unsigned long long)(first + done - 1),
         (bench_now() - t0) / 60, fails, crashes, hangs, skipped);
  if (fails || crashes || hangs || skipped) printf("fuzz: details in %s\n", log_path);
  return fails || crashes || hangs || skipped;
}
