// delay_line: a link with a fixed one-way latency between network namespaces, for kernels without
// netem (tests/multihost/hosts.sh --delay; docs/multihost.md "Latency").
//
//   delay_line --delay-us D [--mtu M] [--queue-bytes Q] [--ready FILE] NETNS_PATH:IFNAME:IPV4 ...
//
// For each host given, enters its network namespace (setns on NETNS_PATH, e.g. /run/netns/NAME), makes a
// TUN device IFNAME there (IFF_TUN | IFF_NO_PI: bare IPv4 packets, no link layer, no ARP) and reads
// every packet the host's kernel sends through it. A packet for the address of another host given is
// written into that host's TUN device D microseconds after it was read; anything else (IPv6 router
// solicitations, addresses no host has) is dropped. The devices belong to this process: they vanish
// when it ends, whatever the reason, so nothing is left behind. hosts.sh sets their addresses, MTU and
// (tc tbf) rate once FILE exists, which is written when every device is made.
//
// Runs until SIGINT or SIGTERM (or its parent's death: PR_SET_PDEATHSIG), then prints what it forwarded
// and exits 0. Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (root).
//
// Note [One time-ordered queue]
// Every packet waits in one queue ordered by its release time (read time + D; a sequence number keeps
// the order of equal times), so the hosts see their packets in the order they sent them, per pair of
// hosts as on a wire. One timerfd armed at the earliest release time (absolute CLOCK_MONOTONIC, with
// the process's timer slack set to 1 ns) wakes epoll; everything due is written, and the timer is
// re-armed for the next. No thread spins: at 100 us the latency is the kernel's timer wake-up plus
// one write, and the CPU cost is two system calls per packet (a read and a write) and one timer
// wake-up per batch. A rate is not modelled here: hosts.sh shapes the TUN devices with tc's tbf, as
// it shapes the bridge's links, so the kernel paces the packets before this line delays them (a wire:
// serialisation, then propagation). The queue is bounded (--queue-bytes, 64 MiB by default): past it a
// packet is dropped, as a full switch buffer would, and counted.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
}

// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

struct Host {
  std::string netns, ifname;
  uint32_t addr = 0;  // network order
  Fd tun;
  uint64_t packets_in = 0, bytes_in = 0, packets_out = 0, bytes_out = 0;
};

struct Packet {
  int64_t release_ns;
  uint64_t seq;
  size_t to;  // index of the destination host
  std::vector<uint8_t> data;
};
struct LaterFirst {
  bool operator()(const Packet& a, const Packet& b) const {
    return a.release_ns != b.release_ns ? a.release_ns > b.release_ns : a.seq > b.seq;
  }
};

struct Options {
  int64_t delay_ns = -1;
  size_t mtu = 9000;
  size_t queue_bytes = size_t{64} << 20;
  std::string ready;
  std::vector<Host> hosts;
};

Options parse(int argc, char** argv) {
  Options o;
  auto number = [](const char* flag, const char* text) {
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < 0) {
      errno = 0;
      fail(std::string("delay_line: ") + flag + " '" + text + "' is not a non-negative integer");
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "--delay-us" && has_value) {
      o.delay_ns = number("--delay-us", argv[++i]) * 1000;
    } else if (a == "--mtu" && has_value) {
      o.mtu = static_cast<size_t>(number("--mtu", argv[++i]));
    } else if (a == "--queue-bytes" && has_value) {
      o.queue_bytes = static_cast<size_t>(number("--queue-bytes", argv[++i]));
    } else if (a == "--ready" && has_value) {
      o.ready = argv[++i];
    } else {
      size_t c1 = a.find(':'), c2 = a.rfind(':');
      in_addr addr{};
      if (a.starts_with("-") || c1 == std::string::npos || c1 == c2 || inet_pton(AF_INET, a.c_str() + c2 + 1, &addr) != 1) {
        errno = 0;
        fail("delay_line: '" + a + "' is neither an option nor NETNS_PATH:IFNAME:IPV4 (see the usage atop delay_line.cpp)");
      }
      Host h;
      h.netns = a.substr(0, c1);
      h.ifname = a.substr(c1 + 1, c2 - c1 - 1);
      h.addr = addr.s_addr;
      o.hosts.push_back(std::move(h));
    }
  }
  errno = 0;
  if (o.delay_ns < 0) fail("delay_line: --delay-us is required (the one-way delay in microseconds; 0 forwards at once)");
  if (o.hosts.size() < 2) fail("delay_line: give two or more hosts as NETNS_PATH:IFNAME:IPV4");
  if (o.mtu < 576 || o.mtu > 65535) fail("delay_line: --mtu " + std::to_string(o.mtu) + " is out of range (576..65535)");
  return o;
}

// Makes the TUN device inside the host's namespace: TUNSETIFF names it in the caller's namespace, so
// this thread enters it and comes back.
void open_tun(Host& h, int home_ns) {
  Fd ns(::open(h.netns.c_str(), O_RDONLY | O_CLOEXEC));
  if (ns.get() < 0) fail("delay_line: cannot open network namespace " + h.netns);
  if (setns(ns.get(), CLONE_NEWNET) != 0) fail("delay_line: cannot enter network namespace " + h.netns);
  Fd tun(::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (tun.get() < 0) fail("delay_line: cannot open /dev/net/tun (needs CONFIG_TUN and root)");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  if (h.ifname.size() >= IFNAMSIZ) fail("delay_line: interface name '" + h.ifname + "' is too long");
  std::strncpy(ifr.ifr_name, h.ifname.c_str(), IFNAMSIZ - 1);
  if (ioctl(tun.get(), TUNSETIFF, &ifr) != 0) fail("delay_line: TUNSETIFF " + h.ifname + " in " + h.netns);
  h.tun = std::move(tun);
  if (setns(home_ns, CLONE_NEWNET) != 0) fail("delay_line: cannot return to the first network namespace");
}

void epoll_add(int ep, int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = tag;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) fail("delay_line: epoll_ctl");
}

class DelayLine {
 public:
  explicit DelayLine(Options o) : o_(std::move(o)) {}

  int run() {
    started_ns_ = now_ns();
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // the kernel's 50 us default would blur a 100 us delay
    prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    if (sigprocmask(SIG_BLOCK, &stop, nullptr) != 0) fail("delay_line: sigprocmask");
    Fd sig(signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK));
    Fd home(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    Fd ep(epoll_create1(EPOLL_CLOEXEC));
    timer_ = Fd(timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (sig.get() < 0 || home.get() < 0 || ep.get() < 0 || timer_.get() < 0) fail("delay_line: set-up");
    for (Host& h : o_.hosts) open_tun(h, home.get());
    for (size_t i = 0; i < o_.hosts.size(); ++i) epoll_add(ep.get(), o_.hosts[i].tun.get(), i);
    epoll_add(ep.get(), sig.get(), kSignal);
    epoll_add(ep.get(), timer_.get(), kTimer);
    if (!o_.ready.empty()) {
      Fd f(::open(o_.ready.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (f.get() < 0) fail("delay_line: cannot write " + o_.ready);
    }
    std::vector<epoll_event> events(o_.hosts.size() + 2);
    for (;;) {
      int n = epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()), -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("delay_line: epoll_wait");
      }
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kSignal) return report();
        if (tag == kTimer) {
          uint64_t expirations;
          (void)!::read(timer_.get(), &expirations, sizeof expirations);
        } else {
          receive(tag);
        }
      }
      release();
    }
  }

 private:
  static constexpr uint64_t kSignal = ~uint64_t{0}, kTimer = ~uint64_t{0} - 1;

  // Reads every packet the host has sent so far and queues it for its destination.
  void receive(size_t from) {
    Host& h = o_.hosts[from];
    for (;;) {
      std::vector<uint8_t> buf = take_buffer();
      ssize_t got = ::read(h.tun.get(), buf.data(), buf.size());
      if (got < 0) {
        free_.push_back(std::move(buf));
        if (errno == EAGAIN || errno == EINTR) return;
        fail("delay_line: read from " + h.ifname);
      }
      int64_t t = now_ns();
      ++h.packets_in;
      h.bytes_in += static_cast<uint64_t>(got);
      size_t to = destination(buf.data(), static_cast<size_t>(got));
      if (to == o_.hosts.size() || to == from) {
        ++unroutable_;
        free_.push_back(std::move(buf));
        continue;
      }
      if (queued_bytes_ + static_cast<size_t>(got) > o_.queue_bytes) [[unlikely]] {
        ++dropped_;
        free_.push_back(std::move(buf));
        continue;
      }
      buf.resize(static_cast<size_t>(got));
      queued_bytes_ += static_cast<size_t>(got);
      max_queued_ = std::max(max_queued_, queued_bytes_);
      queue_.push(Packet{t + o_.delay_ns, seq_++, to, std::move(buf)});
    }
  }

  // The host whose address is the IPv4 packet's destination (hosts.size() for none).
  size_t destination(const uint8_t* p, size_t n) const {
    if (n < 20 || (p[0] >> 4) != 4) return o_.hosts.size();
    uint32_t dst;
    std::memcpy(&dst, p + 16, sizeof dst);
    for (size_t i = 0; i < o_.hosts.size(); ++i)
      if (o_.hosts[i].addr == dst) return i;
    return o_.hosts.size();
  }

  // Writes every packet whose time has come, then arms the timer for the next one.
  void release() {
    int64_t t = now_ns();
    while (!queue_.empty() && queue_.top().release_ns <= t) {
      // priority_queue::top is const: the packet's buffer is moved out through a cast, then popped.
      Packet& p = const_cast<Packet&>(queue_.top());
      Host& h = o_.hosts[p.to];
      ssize_t put = ::write(h.tun.get(), p.data.data(), p.data.size());
      if (put < 0 && errno != EAGAIN && errno != EINTR && errno != EIO) fail("delay_line: write to " + h.ifname);
      if (put > 0) {
        ++h.packets_out;
        h.bytes_out += static_cast<uint64_t>(put);
      } else {
        ++dropped_;  // the device is down (EIO) or its queue full: a lost packet, as on a wire
      }
      queued_bytes_ -= p.data.size();
      free_.push_back(std::move(p.data));
      queue_.pop();
      if (queue_.empty() || queue_.top().release_ns > t) t = now_ns();
    }
    itimerspec when{};
    if (!queue_.empty()) {
      int64_t at = queue_.top().release_ns;
      when.it_value.tv_sec = at / 1'000'000'000;
      when.it_value.tv_nsec = at % 1'000'000'000;
    }  // else all zero: disarmed
    if (timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &when, nullptr) != 0) fail("delay_line: timerfd_settime");
  }

  std::vector<uint8_t> take_buffer() {
    std::vector<uint8_t> b;
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
    b.resize(o_.mtu);
    return b;
  }

  int report() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    std::fprintf(stderr, "delay_line: cpu_seconds %.3f wall_seconds %.3f\n", cpu, 1e-9 * static_cast<double>(now_ns() - started_ns_));
    for (const Host& h : o_.hosts)
      std::fprintf(stderr, "delay_line: %s %s: sent %llu packets (%llu bytes), received %llu (%llu bytes)\n",
                   h.netns.c_str(), h.ifname.c_str(), static_cast<unsigned long long>(h.packets_in), static_cast<unsigned long long>(h.bytes_in),
                   static_cast<unsigned long long>(h.packets_out), static_cast<unsigned long long>(h.bytes_out));
    std::fprintf(stderr, "delay_line: %llu dropped (queue full or device down), %llu unroutable, queue peak %zu bytes\n",
                 static_cast<unsigned long long>(dropped_), static_cast<unsigned long long>(unroutable_), max_queued_);
    return 0;
  }

  Options o_;
  Fd timer_;
  std::priority_queue<Packet, std::vector<Packet>, LaterFirst> queue_;
  std::vector<std::vector<uint8_t>> free_;
  int64_t started_ns_ = 0;
  uint64_t seq_ = 0, dropped_ = 0, unroutable_ = 0;
  size_t queued_bytes_ = 0, max_queued_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    return DelayLine(parse(argc, argv)).run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
