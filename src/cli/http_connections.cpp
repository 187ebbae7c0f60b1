// See http_connections.h.
#include "cli/http_connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace mk::cli {

ConnectionPool::ConnectionPool(size_t min_threads, size_t max_threads, std::chrono::milliseconds idle_limit)
    : min_threads_(std::max<size_t>(min_threads, 1)),
      max_threads_(std::max(max_threads, std::max<size_t>(min_threads, 1))),
      idle_limit_(idle_limit) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < min_threads_; ++i) spawn_locked();
}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::spawn_locked() {
  threads_.emplace_back();
  auto it = std::prev(threads_.end());
  ++live_;
  *it = std::thread([this, it] { worker(it); });
}

void ConnectionPool::join_retired_locked(std::unique_lock<std::mutex>& lock) {
  auto retired = std::move(retired_);
  retired_.clear();
  lock.unlock();  // a retired thread may still be returning from worker()
  for (auto it : retired) it->join();
  lock.lock();
  for (auto it : retired) threads_.erase(it);
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::unique_lock lock(mu_);
  if (!retired_.empty()) join_retired_locked(lock);
  jobs_.push_back(std::move(fn));
  // Every job has a thread unless max_threads_ are busy: a slow connection never holds back a new one.
  if (idle_ < jobs_.size() && live_ < max_threads_ && !shutdown_) spawn_locked();
  cv_.notify_one();
}

void ConnectionPool::worker(std::list<std::thread>::iterator self) {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    const bool woke = cv_.wait_for(lock, idle_limit_, [&] { return !jobs_.empty() || shutdown_; });
    --idle_;
    if (jobs_.empty()) {
      if (shutdown_) break;
      if (!woke && live_ > min_threads_) {  // idle for idle_limit_ above the minimum: retire
        retired_.push_back(self);
        --live_;
        return;
      }
      continue;
    }
    auto fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
  --live_;
}

void ConnectionPool::shutdown() {
  std::unique_lock lock(mu_);
  if (shutdown_ && threads_.empty()) return;
  shutdown_ = true;
  cv_.notify_all();
  std::list<std::thread> all = std::move(threads_);
  threads_.clear();
  retired_.clear();
  lock.unlock();
  for (auto& t : all)
    if (t.joinable()) t.join();
}

size_t ConnectionPool::threads() const {
  std::lock_guard lock(mu_);
  return live_;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string address_of(const sockaddr_storage& addr, socklen_t len, int& port) {
  char host[NI_MAXHOST] = {};
  char serv[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "";
  port = std::atoi(serv);
  return host;
}

// One connection's socket as cpp-httplib reads and writes it, with a deadline over each request's
// reading and the server's stop pipes in every wait.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(socket_t sock, HttpServer& server) : sock_(sock), server_(server) {}

  // Waits up to `limit` for the first byte of the next request; false when the connection should
  // close (idle, closed by the client, or the server stopping).
  bool wait_for_request(std::chrono::milliseconds limit) {
    if (buffered() > 0) return true;
    return wait(POLLIN, limit, /*idle=*/true) == Ready::yes;
  }
  // The handler runs once the body is read and reads nothing more, so the deadline set here only
  // bounds the reading of this request (the next one sets its own).
  void start_request() {
    timed_out_ = false;
    eof_ = false;
    const auto limit = server_.request_read_limit;
    deadline_ = limit.count() > 0 ? Clock::now() + limit : Clock::time_point::max();
  }

  bool is_readable() const override {
    if (buffered() > 0) return true;
    return const_cast<ConnectionStream*>(this)->wait_read() == Ready::yes;
  }
  bool is_writable() const override {
    if (timed_out_ || server_.hard_stopped()) return false;
    if (const_cast<ConnectionStream*>(this)->wait(POLLOUT, server_.write_timeout(), false) != Ready::yes) return false;
    // Not cpp-httplib's is_socket_alive, which takes a readable socket peeking 0 bytes (the peer's
    // FIN) for a closed connection: a client that half-closes after its request (shutdown(SHUT_WR),
    // `nc -N`) still reads the reply. A peer that closed altogether answers the next write with a
    // reset, which the peek after it reports (ECONNRESET) and the write itself fails on (EPIPE).
    pollfd p{sock_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    char c;
    ssize_t n;
    do n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (buffered() > 0) {
      const size_t n = std::min(size, buffered());
      std::memcpy(ptr, buf_.data() + off_, n);
      off_ += n;
      return static_cast<ssize_t>(n);
    }
    if (wait_read() != Ready::yes) return -1;
    off_ = len_ = 0;
    ssize_t n;
    do n = ::recv(sock_, buf_.data(), buf_.size(), 0);
    while (n < 0 && errno == EINTR);
    if (n == 0) eof_ = true;
    if (n <= 0) return n;
    const size_t give = std::min(size, static_cast<size_t>(n));
    std::memcpy(ptr, buf_.data(), give);
    off_ = give;
    len_ = static_cast<size_t>(n);
    return static_cast<ssize_t>(give);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  // The client closed its side while this request was being read (the request is incomplete).
  bool eof() const { return eof_; }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip = address_of(addr, len, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) ip = address_of(addr, len, port);
  }
  socket_t socket() const override { return sock_; }
  bool timed_out() const { return timed_out_; }

 private:
  enum class Ready { yes, timeout, stopped, error };
  size_t buffered() const { return len_ - off_; }

  // Waits for `events` up to `limit`, or until a stop pipe becomes readable (the idle one only
  // when `idle`).
  Ready wait(short events, std::chrono::milliseconds limit, bool idle) {
    const auto until = Clock::now() + limit;
    for (;;) {
      pollfd p[3] = {{sock_, events, 0}, {server_.stop_fd(true), POLLIN, 0}, {server_.stop_fd(false), POLLIN, 0}};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left < 0) return Ready::timeout;
      const int rc = ::poll(p, idle ? 3 : 2, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return Ready::error;
      if (rc == 0) return Ready::timeout;
      if (p[1].revents || (idle && p[2].revents)) return Ready::stopped;
      return Ready::yes;  // readable/writable, or an error or hang-up the next call reports
    }
  }

  // A read of the request: up to the read timeout, and not past the request's deadline. A request
  // that does not arrive in time is answered 408 (once) and its connection closed.
  Ready wait_read() {
    if (timed_out_) return Ready::timeout;
    auto limit = server_.read_timeout();
    const bool bounded = deadline_ != Clock::time_point::max();
    if (bounded)
      limit = std::min(limit, std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()));
    const Ready r = limit.count() < 0 ? Ready::timeout : wait(POLLIN, limit, false);
    if (r == Ready::timeout && bounded) send_408();
    return r;
  }

  void send_408() {
    timed_out_ = true;
    const std::string body = fmt::format(
        R"({{"error": {{"message": "the request did not arrive in time: it must be sent within {} ms of its first byte, )"
        R"(with no pause over {} s", "type": "invalid_request_error", "param": null, "code": "request_timeout"}}}})",
        server_.request_read_limit.count(), server_.read_timeout().count() / 1000);
    const std::string reply = fmt::format(
        "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: "
        "close\r\n\r\n{}",
        body.size(), body);
    server_.count_timeout();
    if (wait(POLLOUT, std::chrono::milliseconds(1000), false) == Ready::yes)
      (void)::send(sock_, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  socket_t sock_;
  HttpServer& server_;
  std::array<char, 4096> buf_{};
  size_t off_ = 0, len_ = 0;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool timed_out_ = false;
  bool eof_ = false;
};

}  // namespace

HttpServer::HttpServer() {
  if (::pipe2(idle_pipe_, O_CLOEXEC | O_NONBLOCK) != 0 || ::pipe2(hard_pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(fmt::format("serve: cannot create a pipe: {}", std::strerror(errno)));
}

HttpServer::~HttpServer() {
  for (int fd : {idle_pipe_[0], idle_pipe_[1], hard_pipe_[0], hard_pipe_[1]})
    if (fd >= 0) ::close(fd);
}

void HttpServer::stop_idle() {
  if (!idle_stopped_.exchange(true)) (void)!::write(idle_pipe_[1], "x", 1);
}

void HttpServer::hard_stop() {
  stop_idle();
  if (!hard_stopped_.exchange(true)) (void)!::write(hard_pipe_[1], "x", 1);
}

std::chrono::milliseconds HttpServer::read_timeout() const {
  return std::chrono::milliseconds(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000);
}
std::chrono::milliseconds HttpServer::write_timeout() const {
  return std::chrono::milliseconds(write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
}

// As cpp-httplib's own (keep-alive loop up to keep_alive_max_count_ requests, each waited for up to
// keep_alive_timeout_sec_, none once the listener is closed), with ConnectionStream.
namespace {
// The connection this thread is answering, and whether it closes after the current response.
thread_local const ConnectionStream* t_stream = nullptr;
thread_local bool t_close_after = false;
}  // namespace

void HttpServer::close_after_response() { t_close_after = true; }
bool HttpServer::request_timed_out() { return t_stream != nullptr && t_stream->timed_out(); }
bool HttpServer::client_left() { return t_stream != nullptr && t_stream->eof(); }

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(sock, *this);
  t_stream = &strm;
  bool ret = false;
  for (size_t count = keep_alive_max_count_; count > 0 && svr_sock_ != INVALID_SOCKET && !idle_stopped_; --count) {
    if (!strm.wait_for_request(std::chrono::seconds(keep_alive_timeout_sec_))) break;
    strm.start_request();
    bool connection_closed = false;
    t_close_after = false;
    ret = process_request(strm, count == 1, connection_closed, nullptr);
    if (!ret || connection_closed || strm.timed_out() || t_close_after) break;
  }
  if (t_close_after) {
    // A lingering close (as HTTP servers do after refusing a request whose body they did not
    // read): the reply is sent and our side shut, then what the client still sends is read and
    // dropped for up to 2 s, so that a client still writing its body gets to read the refusal
    // instead of a reset. Never parsed: nothing of it can be taken as a request.
    ::shutdown(sock, SHUT_WR);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    std::array<char, 65536> sink;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      if (left <= 0 || hard_stopped_) break;
      pollfd fds[2] = {{sock, POLLIN, 0}, {hard_pipe_[0], POLLIN, 0}};
      if (::poll(fds, 2, static_cast<int>(left)) <= 0 || fds[1].revents != 0) break;
      const ssize_t n = ::recv(sock, sink.data(), sink.size(), 0);
      if (n <= 0) break;
    }
  }
  t_close_after = false;
  t_stream = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace mk::cli
