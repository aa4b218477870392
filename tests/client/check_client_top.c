/*
 * `kvdock top` against the real kvdockd (cpu backend): --once prints one
 * plain frame with the streams, the operations that had traffic, the
 * pools by kind and the clients; a pipe gets frames one after another
 * (--count); the interactive view, driven through a pseudo-terminal
 * (forkpty), draws on the alternate screen and exits 0 on 'q' and on
 * Ctrl-C with the terminal restored (canonical mode and echo back, the
 * cursor shown, the main screen back); at 80x24 with more operations,
 * pools and clients than fit, every section keeps its header and first
 * rows within the screen and says how many it leaves out; usage errors
 * exit 2.
 */
#include "testutil.h"

#include <errno.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>

/* Some traffic and a pool to show. */
static void make_traffic(kvd_client_t *cli)
{
    kvd_pool_spec_t spec = {.name = "top-pool", .kind = KVD_MEM_HOST, .num_layers = 2,
                            .num_slots = 64, .slot_bytes = 128, .shared = false};
    kvd_pool_info_t info;
    int i;

    KVT_OK(cli, kvd_pool_create(cli, &spec, &info));
    for (i = 0; i < 20; i++)
        KVT_OK(cli, kvd_ping(cli, "x", 1));
}

/* The line of text holding needle (NULL if none), its length in *len. */
static const char *line_of(const char *text, const char *needle, size_t *len)
{
    const char *p = strstr(text, needle);

    if (p == NULL)
        return NULL;
    p += *p == '\n'; /* a needle that starts a line */
    while (p > text && p[-1] != '\n')
        p--;
    *len = strcspn(p, "\n");
    return p;
}

/* In text, the row holding row_word lies under the header holding
 * head_word: each header's value starts where the header starts (left
 * aligned) or ends where it ends (right aligned). */
static void columns_under(const char *text, const char *head_word, const char *row_word)
{
    size_t hn = 0, rn = 0;
    const char *h = line_of(text, head_word, &hn), *row = line_of(text, row_word, &rn);

    ck_assert_msg(h != NULL && row != NULL, "no '%s' header or '%s' row:\n%s", head_word,
                  row_word, text);
    for (size_t i = 0; i < hn;) {
        size_t s, e;
        int left, right;

        while (i < hn && h[i] == ' ')
            i++;
        if (i == hn)
            break;
        for (s = i; i < hn && h[i] != ' '; i++)
            ;
        e = i;
        left = s < rn && row[s] != ' ' && (s == 0 || row[s - 1] == ' ');
        right = e <= rn && row[e - 1] != ' ' && (e == rn || row[e] == ' ');
        ck_assert_msg(left || right, "column %.*s is not under its header:\n%.*s\n%.*s",
                      (int)(e - s), h + s, (int)hn, h, (int)rn, row);
    }
}

START_TEST(test_top_once)
{
    kvd_client_t *cli = kvt_connect("top-traffic");
    kvt_cli_result_t r;
    const char *out;

    make_traffic(cli);
    r = kvt_cli("top", "--once", "--interval", "0.2", NULL);
    KVT_EXPECT_RC(r, 0);
    out = r.out;
    ck_assert_msg(strchr(out, '\x1b') == NULL, "--once wrote escape sequences:\n%s", out);
    ck_assert_ptr_nonnull(strstr(out, "kvdock top - kvdockd "));
    ck_assert_ptr_nonnull(strstr(out, "backend cpu"));
    ck_assert_ptr_nonnull(strstr(out, "clients 2 "));
    ck_assert_ptr_nonnull(strstr(out, "pools 1 "));
    /* streams, with rates (two samples) */
    ck_assert_ptr_nonnull(strstr(out, "STREAM"));
    ck_assert_ptr_nonnull(strstr(out, "BUSY%"));
    ck_assert_ptr_nonnull(strstr(out, "\nreload "));
    ck_assert_ptr_nonnull(strstr(out, "\nwrite "));
    ck_assert_ptr_nonnull(strstr(out, "\noffload "));
    ck_assert_ptr_nonnull(strstr(out, "\nd2d "));
    ck_assert_ptr_null(strstr(out, "rates from the next refresh"));
    /* operations that had requests, with their totals */
    ck_assert_ptr_nonnull(strstr(out, "REQ/S"));
    {
        const char *p = strstr(out, "\nping ");
        ck_assert_ptr_nonnull(p);
        ck_assert_msg(strstr(p, " 20 ") != NULL || strstr(p, " 20\n") != NULL,
                      "ping total not 20:\n%s", out);
    }
    ck_assert_ptr_nonnull(strstr(out, "\npool_create "));
    ck_assert_ptr_null(strstr(out, "\nfp8_set ")); /* no traffic: not shown */
    /* pool occupancy */
    ck_assert_ptr_nonnull(strstr(out, "pools: host 1 (32.0 KiB)"));
    ck_assert_ptr_nonnull(strstr(out, "top-pool"));
    /* every table's values under their headers */
    columns_under(out, "BUSY%", "\nreload ");
    columns_under(out, "REQ/S", "\nping ");
    columns_under(out, "SLOT_B", "top-pool");
    columns_under(out, "INFLIGHT", "top-traffic");
    /* clients, this one marked */
    ck_assert_ptr_nonnull(strstr(out, "top-traffic"));
    ck_assert_ptr_nonnull(strstr(out, "kvdock-top (this top)"));
    ck_assert_ptr_nonnull(strstr(out, "INFLIGHT"));
    kvt_cli_free(&r);
    kvd_client_destroy(&cli);
}
END_TEST

/* stdout a pipe: plain frames, one after another. */
START_TEST(test_top_pipe_count)
{
    kvt_cli_result_t r = kvt_cli("top", "--count", "3", "--interval", "0.1", NULL);
    int frames = 0;

    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_null(strchr(r.out, '\x1b'));
    for (const char *p = r.out; (p = strstr(p, "kvdock top - ")) != NULL; p++)
        frames++;
    ck_assert_int_eq(frames, 3);
    kvt_cli_free(&r);
}
END_TEST

START_TEST(test_top_usage)
{
    static const char *const bad[][3] = {
        {"--interval", "0", NULL}, {"--interval", "x", NULL}, {"--count", "0", NULL},
        {"--bogus", NULL, NULL},   {"--interval", NULL, NULL},
    };
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvt_cli_result_t r = kvt_cli("top", bad[i][0], bad[i][1], NULL);
        ck_assert_msg(r.rc == 2, "%s %s: exit %d", bad[i][0], bad[i][1] ? bad[i][1] : "", r.rc);
        ck_assert_ptr_nonnull(strstr(r.err, "usage: kvdock top"));
        kvt_cli_free(&r);
    }
    {
        /* --json: a JSON object per frame, one a line */
        kvt_cli_result_t r = kvt_cli("--json", "top", "--count", "2", "--interval", "0.1", NULL);
        char *nl;
        int lines = 0;

        KVT_EXPECT_RC(r, 0);
        ck_assert_ptr_null(strchr(r.out, '\x1b'));
        for (char *line = r.out; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
            *nl = '\0';
            ck_assert_msg(kvt_json_object_valid(line), "not a JSON object: %s", line);
            ck_assert_ptr_nonnull(strstr(line, "\"streams\":["));
            lines++;
        }
        ck_assert_int_eq(lines, 2);
        kvt_cli_free(&r);
    }
    {
        const char *argv[] = {kvt_cli_path(), "top", "--help", NULL};
        char *out = NULL, *err = NULL;
        ck_assert_int_eq(kvt_run(argv, &out, &err, 20000), 0);
        ck_assert_ptr_nonnull(strstr(out, "--once"));
        ck_assert_ptr_nonnull(strstr(out, "not a terminal"));
        free(out);
        free(err);
    }
    {
        kvt_cli_result_t r = kvt_cli_at("/nonexistent/kvdock.sock", "top", "--once", NULL);
        KVT_EXPECT_RC(r, 1);
        ck_assert_ptr_nonnull(strstr(r.err, "ECONN"));
        kvt_cli_free(&r);
    }
}
END_TEST

/* ---- through a pseudo-terminal ------------------------------------------ */

typedef struct pty_run {
    pid_t pid;
    int master;
    char *out;
    size_t len, cap;
} pty_run_t;

static void pty_start_at(pty_run_t *r, const char *socket, unsigned short rows,
                         unsigned short cols)
{
    struct winsize ws = {.ws_row = rows, .ws_col = cols};

    memset(r, 0, sizeof(*r));
    r->cap = 1 << 16;
    r->out = malloc(r->cap);
    ck_assert_ptr_nonnull(r->out);
    r->pid = forkpty(&r->master, NULL, NULL, &ws);
    ck_assert_int_ge(r->pid, 0);
    if (r->pid == 0) {
        execl(kvt_cli_path(), kvt_cli_path(), "--socket", socket, "top", "--interval", "0.2",
              (char *)NULL);
        _exit(127);
    }
}

static void pty_start_size(pty_run_t *r, unsigned short rows, unsigned short cols)
{
    pty_start_at(r, kvt_d.socket, rows, cols);
}

static void pty_start(pty_run_t *r)
{
    pty_start_size(r, 40, 120);
}

/* Read what the pty says until needle appears after from (or EOF). */
static int pty_read_until(pty_run_t *r, const char *needle, size_t from, int timeout_ms)
{
    uint64_t deadline = (uint64_t)kvt_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        struct pollfd p = {r->master, POLLIN, 0};
        ssize_t n;

        r->out[r->len] = '\0';
        if (needle != NULL && r->len > from && strstr(r->out + from, needle) != NULL)
            return 1;
        if ((uint64_t)kvt_now_ms() >= deadline)
            return 0;
        if (poll(&p, 1, 100) <= 0)
            continue;
        if (r->len + 4096 >= r->cap) {
            r->cap *= 2;
            r->out = realloc(r->out, r->cap);
            ck_assert_ptr_nonnull(r->out);
        }
        n = read(r->master, r->out + r->len, r->cap - r->len - 1);
        if (n <= 0) /* EIO once the child is gone */
            return needle == NULL;
        r->len += (size_t)n;
    }
}

static int pty_wait(pty_run_t *r, int timeout_ms)
{
    uint64_t deadline = (uint64_t)kvt_now_ms() + (uint64_t)timeout_ms;
    int status;

    while ((uint64_t)kvt_now_ms() < deadline) {
        if (waitpid(r->pid, &status, WNOHANG) == r->pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(10000);
    }
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    return -1;
}

static void interactive(const char *keys)
{
    pty_run_t r;
    size_t mark;
    struct termios t;
    int rc;
    const char *last_frame;

    pty_start(&r);
    /* the alternate screen, the cursor hidden, then a full frame twice */
    ck_assert_msg(pty_read_until(&r, "\x1b[?1049h", 0, 10000), "no alternate screen:\n%s", r.out);
    ck_assert_msg(pty_read_until(&r, "\x1b[?25l", 0, 10000), "cursor not hidden");
    ck_assert_msg(pty_read_until(&r, "CLIENT", 0, 10000), "no frame:\n%s", r.out);
    mark = r.len;
    ck_assert_msg(pty_read_until(&r, "STREAM", mark, 10000), "no second frame");
    ck_assert_ptr_nonnull(strstr(r.out, "kvdock-top (this top)"));
    /* while it runs, the terminal is in non-canonical mode without echo */
    ck_assert_int_eq(tcgetattr(r.master, &t), 0);
    ck_assert_msg(!(t.c_lflag & ICANON) && !(t.c_lflag & ECHO), "terminal not in key mode");
    mark = r.len;
    ck_assert_int_eq(write(r.master, keys, strlen(keys)), (ssize_t)strlen(keys));
    pty_read_until(&r, NULL, mark, 10000); /* to EOF */
    rc = pty_wait(&r, 10000);
    ck_assert_msg(rc == 0, "exit %d after '%s'\n%s", rc, keys[0] == 3 ? "^C" : keys, r.out);
    /* restored: the cursor shown and the main screen back, after the last frame */
    last_frame = r.out;
    {
        const char *p;
        for (p = r.out; (p = strstr(p, "kvdock top - ")) != NULL; p++)
            last_frame = p;
    }
    ck_assert_msg(strstr(last_frame, "\x1b[?25h") != NULL, "cursor not shown at exit");
    ck_assert_msg(strstr(last_frame, "\x1b[?1049l") != NULL, "main screen not restored");
    ck_assert_int_eq(tcgetattr(r.master, &t), 0);
    ck_assert_msg((t.c_lflag & ICANON) && (t.c_lflag & ECHO), "terminal mode not restored");
    close(r.master);
    free(r.out);
}

START_TEST(test_top_interactive_q)
{
    interactive("q");
}
END_TEST

START_TEST(test_top_interactive_ctrl_c)
{
    interactive("\x03");
}
END_TEST

/* A key other than q refreshes; SIGTERM also exits cleanly. */
START_TEST(test_top_interactive_sigterm)
{
    pty_run_t r;
    struct termios t;
    size_t mark;

    pty_start(&r);
    ck_assert(pty_read_until(&r, "CLIENT", 0, 10000));
    mark = r.len;
    ck_assert_int_eq(write(r.master, " ", 1), 1);
    ck_assert(pty_read_until(&r, "CLIENT", mark, 10000));
    kill(r.pid, SIGTERM);
    pty_read_until(&r, NULL, r.len, 10000);
    ck_assert_int_eq(pty_wait(&r, 10000), 0);
    ck_assert_ptr_nonnull(strstr(r.out + mark, "\x1b[?1049l"));
    ck_assert_int_eq(tcgetattr(r.master, &t), 0);
    ck_assert((t.c_lflag & ICANON) && (t.c_lflag & ECHO));
    close(r.master);
    free(r.out);
}
END_TEST

/* The screen of the last whole frame in what the pty said: from its last
 * cursor-home to the clear after it, escape sequences taken out, lines
 * split at CR LF.  Returns the number of lines; lines[i] malloc'd. */
static int last_screen(const char *out, char **lines, int cap)
{
    const char *end = NULL, *start = NULL, *p;
    int n = 0;

    for (p = out; (p = strstr(p, "\x1b[J")) != NULL; p++)
        end = p; /* the clear below the frame ends it */
    ck_assert_ptr_nonnull(end);
    for (p = out; (p = strstr(p, "\x1b[H")) != NULL && p < end; p++)
        start = p + 3;
    ck_assert_ptr_nonnull(start);
    lines[0] = calloc(1, (size_t)(end - start) + 1);
    for (p = start; p < end && n < cap; p++) {
        if (*p == '\x1b') { /* CSI: ESC [ params final */
            p += 1;
            while (p + 1 < end && !(p[1] >= '@' && p[1] <= '~' && p[1] != '['))
                p++;
            p++;
            continue;
        }
        if (*p == '\r')
            continue;
        if (*p == '\n') {
            if (++n < cap)
                lines[n] = calloc(1, (size_t)(end - p) + 1);
            continue;
        }
        lines[n][strlen(lines[n])] = *p;
    }
    return n < cap ? n + 1 : cap;
}

/* More than fit on 80x24, for the daemon at socket: five pools of cli,
 * each with a ping (and, with more_ops, a pool listing and a status: more
 * kinds of operation than the screen has room for), and four more
 * clients in more[]. */
static void crowd(kvd_client_t *cli, const char *socket, bool more_ops, kvd_client_t *more[4])
{
    for (int i = 0; i < 5; i++) {
        char name[32];
        kvd_pool_spec_t spec = {.name = name, .kind = KVD_MEM_HOST, .num_layers = 2,
                                .num_slots = 64, .slot_bytes = 128, .shared = false};
        kvd_pool_info_t info;

        snprintf(name, sizeof(name), "top-pool-%d", i);
        KVT_OK(cli, kvd_pool_create(cli, &spec, &info));
        KVT_OK(cli, kvd_ping(cli, "x", 1));
        if (more_ops) {
            kvd_pool_info_t list[8];
            size_t count;
            kvd_daemon_status_t *st = malloc(sizeof(*st));

            ck_assert_ptr_nonnull(st);
            KVT_OK(cli, kvd_pool_list(cli, list, 8, &count));
            KVT_OK(cli, kvd_daemon_status(cli, st, NULL, 0));
            free(st);
        }
    }
    for (int i = 0; i < 4; i++)
        KVT_OK(NULL, kvd_client_create(socket, "top-other", &more[i]));
}

/* top on the daemon at socket in an 80x24 pty, stopped by SIGTERM after
 * its second frame (exit 0): the last frame drawn before the main screen
 * came back, in lines (malloc'd); their number, at most 24. */
static int screen_80x24(const char *socket, char **lines, int cap)
{
    pty_run_t r;
    size_t mark;
    int n;

    pty_start_at(&r, socket, 24, 80);
    ck_assert_msg(pty_read_until(&r, "CLIENT", 0, 10000), "no frame:\n%s", r.out);
    mark = r.len;
    ck_assert_msg(pty_read_until(&r, "CLIENT", mark, 10000), "no second frame");
    pty_read_until(&r, "\x1b[J", r.len, 2000);
    kill(r.pid, SIGTERM);
    pty_read_until(&r, NULL, r.len, 10000);
    ck_assert_int_eq(pty_wait(&r, 10000), 0);
    if (strstr(r.out, "\x1b[?1049l") != NULL)
        *strstr(r.out, "\x1b[?1049l") = '\0';
    n = last_screen(r.out, lines, cap);
    ck_assert_msg(n <= 24, "a frame of %d lines on a 24-line screen", n);
    close(r.master);
    free(r.out);
    return n;
}

/* At 80x24, with more operations, pools and clients than fit, every
 * section keeps its header and its first rows, says how many it does not
 * show, and the frame fits the screen: the operations give way. */
START_TEST(test_top_fits_80x24)
{
    kvd_client_t *cli = kvt_connect("top-small"), *more[4];
    char *lines[64];
    const char *want[] = {"pools: host 5", "LAYERS", "top-pool-", "... 3 more pools", "CLIENT",
                          "(this top)", "more clients", "OP ", "more operations", NULL};
    int n, found;

    crowd(cli, kvt_d.socket, true, more);
    n = screen_80x24(kvt_d.socket, lines, 64);
    for (int w = 0; want[w] != NULL; w++) {
        found = 0;
        for (int i = 0; i < n && !found; i++)
            found = strstr(lines[i], want[w]) != NULL;
        if (!found) {
            for (int i = 0; i < n; i++)
                fprintf(stderr, "%2d|%s|\n", i, lines[i]);
            ck_abort_msg("no '%s' on the 80x24 screen", want[w]);
        }
    }
    for (int i = 0; i < n; i++) {
        /* the tables are within 80 columns: nothing of theirs cut */
        if (strstr(lines[i], "top-pool-") != NULL)
            ck_assert_msg(strstr(lines[i], "mha") != NULL, "pool row cut: %s", lines[i]);
        if (strstr(lines[i], "(this top)") != NULL)
            ck_assert_msg(lines[i][strlen(lines[i]) - 1] >= '0' &&
                              lines[i][strlen(lines[i]) - 1] <= '9',
                          "client row cut: %s", lines[i]);
        free(lines[i]);
    }
    for (int i = 0; i < 4; i++)
        kvd_client_destroy(&more[i]);
    kvd_client_destroy(&cli);
}
END_TEST

/* A daemon with a disk level (--cache-dir): top shows it in a line within
 * 80 columns, the frame still fits 80x24 with more pools and clients than
 * fit, and the JSON frame carries it; without one, "disk": null. */
START_TEST(test_top_disk_level)
{
    char top[64], dir[64], *lines[64];
    kvd_client_t *cli = NULL, *more[4];
    kvt_daemon_t d;
    kvt_cli_result_t r;
    int n, found = 0;

    r = kvt_cli("--json", "top", "--count", "1", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"disk\":null"));
    kvt_cli_free(&r);
    kvt_disk_daemon_start(&d, top, dir, "64m");
    KVT_OK(NULL, kvd_client_create(d.socket, "top-disk", &cli));
    crowd(cli, d.socket, false, more);
    r = kvt_cli_at(d.socket, "--json", "top", "--count", "1", NULL);
    KVT_EXPECT_RC(r, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "\"disk\":{\"cache_dir\":"));
    ck_assert_ptr_nonnull(strstr(r.out, "\"budget_bytes\":67108864"));
    kvt_cli_free(&r);
    n = screen_80x24(d.socket, lines, 64);
    for (int i = 0; i < n; i++) {
        if (strncmp(lines[i], "disk: 0 B of 64.0 MiB, ", 23) == 0) {
            found = 1;
            ck_assert_msg(strstr(lines[i], "hits ") != NULL, "disk line cut: %s", lines[i]);
        }
        found |= (strstr(lines[i], "CLIENT") != NULL) << 1;
    }
    if (found != 3) {
        for (int i = 0; i < n; i++)
            fprintf(stderr, "%2d|%s|\n", i, lines[i]);
        ck_abort_msg("no disk line or no client table on the 80x24 screen");
    }
    for (int i = 0; i < n; i++)
        free(lines[i]);
    for (int i = 0; i < 4; i++)
        kvd_client_destroy(&more[i]);
    kvd_client_destroy(&cli);
    kvt_disk_daemon_stop(&d, top);
}
END_TEST

static Suite *top_suite(void)
{
    Suite *s = suite_create("client_top");
    TCase *tc = tcase_create("top");

    tcase_add_unchecked_fixture(tc, kvt_suite_setup, kvt_suite_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_top_once);
    tcase_add_test(tc, test_top_pipe_count);
    tcase_add_test(tc, test_top_usage);
    tcase_add_test(tc, test_top_interactive_q);
    tcase_add_test(tc, test_top_interactive_ctrl_c);
    tcase_add_test(tc, test_top_interactive_sigterm);
    tcase_add_test(tc, test_top_fits_80x24);
    tcase_add_test(tc, test_top_disk_level);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(top_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
