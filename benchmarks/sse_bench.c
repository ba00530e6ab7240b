/* A compiled SSE upstream and load generator for benchmarks/bench_gateway.py (one epoll loop
 * each, no allocation per event), so the figures show the proxy, not the harness.
 *
 *   sse_bench serve <port> <chunks> <interval_ms>
 *       HTTP/1.1 keep-alive server on 127.0.0.1: GET /health -> 200; any POST -> response headers
 *       and the first SSE chunk at once (as vLLM sends them after prefill), the remaining chunks
 *       every interval_ms, then "data: [DONE]" and the last chunk. Runs until killed.
 *   sse_bench load <port> <burst|steady> <concurrency> <requests> <timeout_s> [header ...]
 *       burst: all <concurrency> streams start together; steady: <concurrency> in flight until
 *       <requests> have started. One POST per connection. Prints one line per request:
 *       "<ok 0|1> <time to first SSE byte, us> <time to end, us>" (times from connect()).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXC 65536
#define RBUF 8192

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void nodelay_nonblock(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1; /* EAGAIN on a ~150-byte chunk means a stuck peer: drop it */
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---------------------------------------------------------------- server */
struct sconn {
    int fd, active, sent;
    long long due;
    size_t len;
    char buf[RBUF];
};
static struct sconn *sc[MAXC];
static int smax; /* highest fd seen, so the timer scan stays short */

static int chunk(char *out, int i) {
    char data[160];
    int n = snprintf(data, sizeof data,
                     "data: {\"object\":\"chat.completion.chunk\",\"index\":%d,"
                     "\"choices\":[{\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i, i);
    return sprintf(out, "%x\r\n%s\r\n", n, data);
}

static void sclose(int ep, struct sconn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    sc[c->fd] = NULL;
    free(c);
}

/* a complete request in c->buf? returns its length (headers + body) or 0 */
static size_t request_len(struct sconn *c) {
    c->buf[c->len] = 0;
    char *end = strstr(c->buf, "\r\n\r\n");
    if (!end) return 0;
    size_t head = (size_t)(end - c->buf) + 4, body = 0;
    char *cl = strcasestr(c->buf, "\r\ncontent-length:");
    if (cl && cl < end) body = strtoul(cl + 17, NULL, 10);
    return c->len >= head + body ? head + body : 0;
}

static int serve(int port, int chunks, int interval_ms) {
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 4096)) { perror("bind/listen"); return 1; }
    fcntl(ls, F_SETFL, O_NONBLOCK);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls}, evs[512];
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    char out[512];
    for (;;) {
        long long t = now_us(), next = -1;
        for (int fd = 0; fd <= smax; fd++) { /* send due chunks; find the next due time */
            struct sconn *c = sc[fd];
            if (!c || !c->active) continue;
            while (c->active && c->due <= t) {
                int n;
                if (c->sent < chunks) { n = chunk(out, c->sent); c->sent++; }
                else {
                    n = sprintf(out, "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
                    c->active = 0;
                }
                if (write_all(fd, out, (size_t)n)) { sclose(ep, c); c = NULL; break; }
                if (c->sent < chunks || c->active) c->due += interval_ms * 1000LL;
                if (interval_ms > 0) break;
            }
            if (c && c->active && (next < 0 || c->due < next)) next = c->due;
        }
        int wait_ms = next < 0 ? 1000 : (int)((next - now_us() + 999) / 1000);
        if (wait_ms < 0) wait_ms = 0;
        int n = epoll_wait(ep, evs, 512, wait_ms);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int cfd;
                while ((cfd = accept(ls, NULL, NULL)) >= 0) {
                    if (cfd >= MAXC) { close(cfd); continue; }
                    nodelay_nonblock(cfd);
                    struct sconn *c = calloc(1, sizeof *c);
                    c->fd = cfd;
                    sc[cfd] = c;
                    if (cfd > smax) smax = cfd;
                    struct epoll_event e = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &e);
                }
                continue;
            }
            struct sconn *c = sc[fd];
            if (!c) continue;
            ssize_t r = read(fd, c->buf + c->len, RBUF - 1 - c->len);
            if (r <= 0) { if (r == 0 || errno != EAGAIN) sclose(ep, c); continue; }
            c->len += (size_t)r;
            size_t req = request_len(c);
            if (!req) { if (c->len >= RBUF - 1) sclose(ep, c); continue; }
            int is_get = strncmp(c->buf, "GET ", 4) == 0;
            memmove(c->buf, c->buf + req, c->len - req); /* keep-alive: keep what follows */
            c->len -= req;
            if (is_get) {
                const char *ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                if (write_all(fd, ok, strlen(ok))) sclose(ep, c);
                continue;
            }
            const char *h = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n";
            int m = sprintf(out, "%s", h);
            m += chunk(out + m, 0);
            if (write_all(fd, out, (size_t)m)) { sclose(ep, c); continue; }
            c->sent = 1;
            c->active = 1;
            c->due = now_us() + interval_ms * 1000LL;
        }
    }
}

/* ---------------------------------------------------------------- load generator */
struct lconn {
    int fd, state; /* 0 connecting, 1 reading */
    long long t0, tfirst;
    char tail[16];
    size_t tlen;
};

static char req[4096];
static size_t reqlen;
static struct sockaddr_in target;
static int ep_l, started, finished, total, port_l;
static struct lconn *lc[MAXC];

static void report(struct lconn *c, int ok) {
    long long t = now_us();
    printf("%d %lld %lld\n", ok, c->tfirst ? c->tfirst - c->t0 : -1, t - c->t0);
    finished++;
}

static void start_one(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || fd >= MAXC) { perror("socket"); exit(1); }
    nodelay_nonblock(fd);
    struct lconn *c = calloc(1, sizeof *c);
    c->fd = fd;
    c->t0 = now_us();
    lc[fd] = c;
    started++;
    if (connect(fd, (void *)&target, sizeof target) && errno != EINPROGRESS) {
        report(c, 0); close(fd); lc[fd] = NULL; free(c); return;
    }
    struct epoll_event e = {.events = EPOLLOUT | EPOLLIN, .data.fd = fd};
    epoll_ctl(ep_l, EPOLL_CTL_ADD, fd, &e);
}

static void lfinish(struct lconn *c, int ok) {
    report(c, ok);
    epoll_ctl(ep_l, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    lc[c->fd] = NULL;
    free(c);
}

static int load(int port, int steady, int conc, int requests, int timeout_s, int nh, char **hdrs) {
    port_l = port;
    target.sin_family = AF_INET;
    target.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &target.sin_addr);
    const char *body = "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    int n = sprintf(req, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n",
                    strlen(body));
    for (int i = 0; i < nh; i++) n += sprintf(req + n, "%s\r\n", hdrs[i]);
    n += sprintf(req + n, "\r\n%s", body);
    reqlen = (size_t)n;
    total = steady ? requests : conc;
    ep_l = epoll_create1(0);
    for (int i = 0; i < conc && started < total; i++) start_one();
    long long deadline = now_us() + timeout_s * 1000000LL;
    struct epoll_event evs[512];
    char buf[65536];
    while (finished < total && now_us() < deadline) {
        int k = epoll_wait(ep_l, evs, 512, 100);
        for (int i = 0; i < k; i++) {
            struct lconn *c = lc[evs[i].data.fd];
            if (!c) continue;
            if (c->state == 0) {
                if (evs[i].events & (EPOLLERR | EPOLLHUP)) { lfinish(c, 0); goto next; }
                if (!(evs[i].events & EPOLLOUT)) continue;
                int err = 0;
                socklen_t l = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
                if (err || write_all(c->fd, req, reqlen)) { lfinish(c, 0); goto next; }
                c->state = 1;
                struct epoll_event e = {.events = EPOLLIN, .data.fd = c->fd};
                epoll_ctl(ep_l, EPOLL_CTL_MOD, c->fd, &e);
                continue;
            }
            for (;;) {
                ssize_t r = read(c->fd, buf, sizeof buf - 1);
                if (r < 0 && errno == EAGAIN) break;
                if (r <= 0) { lfinish(c, 0); goto next; }
                buf[r] = 0;
                if (!c->tfirst && memmem(buf, (size_t)r, "data: ", 6)) c->tfirst = now_us();
                /* the end: the terminal chunk, possibly split across reads */
                char joined[16 + 65536];
                size_t keep = c->tlen;
                memcpy(joined, c->tail, keep);
                memcpy(joined + keep, buf, (size_t)r);
                size_t jl = keep + (size_t)r;
                if (jl >= 5 && memcmp(joined + jl - 5, "0\r\n\r\n", 5) == 0 && c->tfirst) {
                    lfinish(c, 1);
                    goto next;
                }
                c->tlen = jl < 8 ? jl : 8;
                memcpy(c->tail, joined + jl - c->tlen, c->tlen);
            }
        next:
            if (steady && started < total && (started - finished) < conc) start_one();
        }
        while (steady && started < total && (started - finished) < conc) start_one();
    }
    for (int fd = 0; fd < MAXC; fd++) /* unfinished at the deadline: lost */
        if (lc[fd]) lfinish(lc[fd], 0);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "serve") == 0) return serve(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc >= 7 && strcmp(argv[1], "load") == 0)
        return load(atoi(argv[2]), strcmp(argv[3], "steady") == 0, atoi(argv[4]), atoi(argv[5]),
                    atoi(argv[6]), argc - 7, argv + 7);
    fprintf(stderr, "usage: see the comment at the top of sse_bench.c\n");
    return 2;
}
