// Capacity of one `trainguard controller`, through the real transport: this
// process plays N agents over gRPC (one connection each, as real nodes have)
// against a controller it starts as a child process, and measures it.
//
// Traffic, as real agents send it: Register; RanksStarted on every Start;
// a heartbeat every second per node with its 8 ranks' status (journal
// groups, operations in flight and recent, link counters: about 5.6 KB);
// optionally a Timings message with each heartbeat (--timings); ClockEcho
// for every ClockProbe; on Stop, a Stopped with every rank's last output
// lines (--log-lines per rank, distinct per node) and kernel lines.
//
// Phases: connect all nodes (time until every node got its Start);
// steady heartbeats for --steady seconds (controller CPU and memory over
// that window); optionally the controller frozen with SIGSTOP for --stall
// seconds while the agents go on (no healthy node may be declared lost);
// a failure (rank 0 exits 1): time until every node got its Stop (p50, p99,
// max) and until every node got the next Start. Then it counts the nodes the
// controller dropped (sessions it closed) and the node_lost events in the
// store.
//
// With --lock-store, another process holds the job's SQLite store locked
// from before the failure until every node restarted.
//
//   build/bench/fleet_load_bench --nodes 2000 [--nproc 8] [--steady 20] [--stall 0] [--lock-store]
//                                [--timings] [--log-lines 20] [--trainguard build/trainguard]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sqlite3.h>

#include "proto/protocol.h"
#include "proto/trainguard.grpc.pb.h"
#include "store/event_store.h"

using namespace trainguard;
using Steady = std::chrono::steady_clock;

namespace {

double Since(Steady::time_point t0, Steady::time_point t) { return std::chrono::duration<double>(t - t0).count(); }
std::int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Options {
  int nodes = 250;
  int nproc = 8;
  double steady_s = 15;
  double stall_s = 0;
  bool lock_store = false;
  bool timings = false;
  int log_lines = 20;
  std::string trainguard = TG_BINARY;
  std::string dir = "/tmp";
};

// One simulated agent: a bidirectional stream on its own connection.
class SimAgent final : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ControllerMessage> {
 public:
  SimAgent(int index, const Options& o) : index_(index), o_(o) {}

  void Connect(v1::Controller::Stub* stub, const std::string& secret) {
    stub->async()->Session(&ctx_, this);
    StartRead(&in_);
    StartCall();
    v1::AgentMessage m;
    v1::Register* r = m.mutable_register_();
    r->set_protocol_version(kProtocolVersion);
    r->set_node_id(NodeId());
    r->set_hostname(NodeId());
    r->set_address("127.0.0.1");
    r->set_nproc_per_node(o_.nproc);
    r->set_free_port(30000 + index_ % 30000);
    r->set_pid(100000 + index_);
    r->set_job_secret(secret);
    Send(std::move(m));
  }
  std::string NodeId() const {
    char b[32];
    std::snprintf(b, sizeof b, "node%05d", index_);
    return b;
  }

  void Send(v1::AgentMessage m) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || writes_done_) return;
    out_.push_back(std::move(m));
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    if (!ok) {
      out_.clear();
      writing_ = false;
      return;
    }
    if (!out_.empty()) {
      StartWrite(&out_.front());
    } else {
      writing_ = false;
    }
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      closed_by_controller_ = !ending_.load();
      return;
    }
    auto now = Steady::now();
    switch (in_.kind_case()) {
      case v1::ControllerMessage::kStart: {
        generation_ = in_.start().generation();
        last_start_ = now;
        starts_++;
        v1::AgentMessage m;
        auto* s = m.mutable_started();
        s->set_generation(generation_);
        s->set_started_unix_ms(UnixMs());
        for (int l = 0; l < o_.nproc; ++l) *s->add_ranks() = Rank(l, 0);
        Send(std::move(m));
        break;
      }
      case v1::ControllerMessage::kStop: {
        last_stop_ = now;
        stops_++;
        running_ = false;
        Send(StoppedMessage(in_.stop().generation()));
        break;
      }
      case v1::ControllerMessage::kClockProbe: {
        v1::AgentMessage m;
        m.mutable_clock_echo()->set_controller_unix_us(in_.clock_probe().controller_unix_us());
        m.mutable_clock_echo()->set_agent_unix_us(UnixMs() * 1000);
        Send(std::move(m));
        break;
      }
      case v1::ControllerMessage::kShutdown: shutdown_ = true; break;
      case v1::ControllerMessage::kWelcome:
        if (!in_.welcome().error().empty()) std::fprintf(stderr, "refused: %s\n", in_.welcome().error().c_str());
        break;
      default: break;
    }
    if (in_.kind_case() == v1::ControllerMessage::kStart) running_ = true;
    StartRead(&in_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  void End() {
    ending_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
    }
    ctx_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; });
  }

  v1::RankStatus Rank(int local, std::int64_t step) const {
    v1::RankStatus r;
    const int global = index_ * o_.nproc + local;
    const int world = o_.nodes * o_.nproc;
    r.set_local_rank(local);
    r.set_global_rank(global);
    r.set_running(true);
    r.set_pid(200000 + global % 100000);
    r.set_attached(true);
    r.set_step(step);
    r.set_step_count(step);
    r.set_progress_age_ms(100 + global % 400);
    std::int64_t now = UnixMs();
    if (step > 0) {
      r.set_first_step_unix_ms(now - step * 1000);
      r.set_last_step_unix_ms(now - 100);
    }
    r.set_checkpoint_step(-1);
    r.set_phase("forward");
    r.set_phase_age_ms(40);
    r.set_proc_state("R");
    r.set_activity_age_ms(5);
    r.set_activity_sampled(true);
    r.set_max_step_ms(1100);
    // The journal: the world, the node's tensor-parallel group and the
    // rank's data-parallel group; ops in flight and the latest completed.
    auto group = [&](int id, const char* name, int size, int first, int stride, std::int64_t issued) {
      v1::CommGroup* g = r.add_groups();
      g->set_id(id);
      g->set_name(name);
      g->set_size(size);
      g->set_first(first);
      g->set_stride(stride);
      g->set_issued(issued);
      g->set_completed(issued);
    };
    group(0, "default_pg", world, 0, 1, step * 2);
    group(1, "tp", o_.nproc, index_ * o_.nproc, 1, step * 24);
    group(2, "dp", o_.nodes, local, o_.nproc, step * 3);
    group(3, "pp", 4, global % o_.nproc, o_.nproc * std::max(1, o_.nodes / 4), step * 8);
    for (int p : {global - 1, global + 1}) {
      v1::PeerCounts* pc = r.add_peers();
      pc->set_peer(p);
      pc->set_sends(step * 4);
      pc->set_recvs(step * 4);
    }
    auto op = [&](v1::CommOp* c, int group_id, std::int64_t seq, const char* name, std::int64_t numel, std::int64_t age,
                  std::int64_t duration) {
      c->set_group_id(group_id);
      c->set_seq(seq);
      c->set_op(name);
      c->set_dtype("bfloat16");
      c->set_numel(numel);
      c->set_peer(-1);
      c->set_age_ms(age);
      c->set_duration_ms(duration);
    };
    op(r.add_ops_in_flight(), 1, step * 24 + 1, "all_reduce", 16777216, 3, -1);
    for (int i = 0; i < 8; ++i) {
      op(r.add_recent_ops(), i % 3, step * 24 - 8 + i, i % 2 ? "all_gather" : "reduce_scatter", 8388608 + i, 30 + i, 4 + i);
    }
    return r;
  }

  v1::AgentMessage Heartbeat(std::int64_t step) const {
    v1::AgentMessage m;
    auto* hb = m.mutable_heartbeat();
    hb->set_generation(running_ ? generation_.load() : -1);
    hb->set_sent_unix_ms(UnixMs());
    auto* metrics = hb->mutable_metrics();
    metrics->set_load1(12.5);
    metrics->set_mem_total_kb(2113929216);
    metrics->set_mem_available_kb(1610612736);
    metrics->set_disk_free_kb(3221225472);
    for (int i = 0; i < 4; ++i) {
      v1::LinkStats* l = metrics->add_links();
      l->set_name("mlx5_" + std::to_string(i) + ":1");
      l->set_kind("ib");
      l->set_up(true);
      l->set_rx_bytes(step * 400000000ULL);
      l->set_tx_bytes(step * 400000000ULL);
      l->set_rx_packets(step * 100000ULL);
      l->set_tx_packets(step * 100000ULL);
    }
    if (running_) {
      for (int l = 0; l < o_.nproc; ++l) *hb->add_ranks() = Rank(l, step);
    }
    return m;
  }

  v1::AgentMessage Timings(std::int64_t step) const {
    v1::AgentMessage m;
    auto* t = m.mutable_timings();
    t->set_generation(generation_);
    for (const char* n : {"data", "forward", "backward", "all_reduce", "optimizer"}) t->add_names(n);
    for (int local = 0; local < o_.nproc; ++local) {
      v1::StepTiming* st = t->add_steps();
      st->set_global_rank(index_ * o_.nproc + local);
      st->set_step(step);
      st->set_start_unix_us(UnixMs() * 1000 - 1000000);
      st->set_duration_us(1000000 + (index_ * 7 + local * 3 + step) % 997);
      std::int64_t at = 0;
      for (int name = 0; name < 5; ++name) {
        v1::PhaseInterval* i = st->add_intervals();
        i->set_name(name);
        i->set_kind(name == 3 ? 10 : 1);
        i->set_start_us(at);
        i->set_duration_us(200000);
        i->set_group_id(name == 3 ? 2 : -1);
        at += 200000;
      }
    }
    return m;
  }

  v1::AgentMessage StoppedMessage(std::int64_t generation) const {
    v1::AgentMessage m;
    auto* s = m.mutable_stopped();
    s->set_generation(generation);
    s->set_free_port(30000 + index_ % 30000);
    s->set_stopped_unix_ms(UnixMs());
    for (int k = 0; k < 10; ++k) {
      s->add_kernel_lines("[" + std::to_string(1000 + k) + ".000] " + NodeId() + " mlx5_core 0000:0" +
                          std::to_string(k) + ":00.0: port module event: cable plugged");
    }
    for (int l = 0; l < o_.nproc; ++l) {
      v1::RankExited* e = s->add_ranks();
      e->set_generation(generation);
      *e->mutable_rank() = Rank(l, 100);
      e->mutable_rank()->set_running(false);
      e->mutable_rank()->set_term_signal(15);
      for (int k = 0; k < o_.log_lines; ++k) {
        e->add_log_tail("[rank" + std::to_string(index_ * o_.nproc + l) + "] step " + std::to_string(100 - k) +
                        " loss 2.31" + std::to_string(k) + " lr 3.0e-4 tokens/s 41253 grad_norm 0.87 mem 61.2 GiB");
      }
    }
    return m;
  }

  v1::AgentMessage Failure() const {
    v1::AgentMessage m;
    auto* e = m.mutable_rank_exited();
    e->set_generation(generation_);
    *e->mutable_rank() = Rank(0, 100);
    e->mutable_rank()->set_running(false);
    e->mutable_rank()->set_exit_code(1);
    e->set_exit_unix_ms(UnixMs());
    e->add_log_tail("Traceback (most recent call last):");
    e->add_log_tail("RuntimeError: CUDA error: an illegal memory access was encountered");
    return m;
  }

  const int index_;
  const Options& o_;
  grpc::ClientContext ctx_;
  v1::ControllerMessage in_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::AgentMessage> out_;
  bool writing_ = false;
  bool writes_done_ = false;
  bool done_ = false;
  std::atomic<bool> ending_{false};
  std::atomic<bool> running_{false};
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> closed_by_controller_{false};
  std::atomic<std::int64_t> generation_{-1};
  std::atomic<int> starts_{0};
  std::atomic<int> stops_{0};
  Steady::time_point last_start_{}, last_stop_{};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct ProcStats {
  double cpu_s = 0;
  long rss_kb = 0;
  int threads = 0;
};

ProcStats ReadProc(pid_t pid) {
  ProcStats p;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close_paren = s.rfind(')');
  if (close_paren == std::string::npos) return p;
  std::vector<std::string> f;
  std::string cur;
  for (char c : s.substr(close_paren + 2)) {
    if (c == ' ') {
      f.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  // Fields from state (3): utime is 14, stime 15 -> indexes 11, 12.
  if (f.size() > 12) p.cpu_s = (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK);
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) p.rss_kb = std::atol(line.c_str() + 6);
    if (line.rfind("Threads:", 0) == 0) p.threads = std::atoi(line.c_str() + 8);
  }
  return p;
}

double SelfCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// Waits (bounded) until `pred` holds; false on timeout.
template <typename Pred>
bool WaitFor(Pred pred, double seconds) {
  auto end = Steady::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (Steady::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--nodes") o.nodes = std::stoi(next());
    else if (a == "--nproc") o.nproc = std::stoi(next());
    else if (a == "--steady") o.steady_s = std::stod(next());
    else if (a == "--stall") o.stall_s = std::stod(next());
    else if (a == "--lock-store") o.lock_store = true;
    else if (a == "--timings") o.timings = true;
    else if (a == "--log-lines") o.log_lines = std::stoi(next());
    else if (a == "--trainguard") o.trainguard = next();
    else if (a == "--dir") o.dir = next();
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string dir = o.dir + "/fleet-load-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string store = dir + "/store.db", secret_file = dir + "/secret", job = "fleet-load";
  const std::string secret = "fleet-load-secret-0123456789abcdef";
  std::ofstream(secret_file) << secret << "\n";
  std::filesystem::permissions(secret_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const int port = FreePort();
  const std::string address = "127.0.0.1:" + std::to_string(port);

  pid_t controller = fork();
  if (controller == 0) {
    int log = open((dir + "/controller.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<std::string> args = {o.trainguard, "controller", "--listen", address, "--nnodes", std::to_string(o.nodes),
                                     "--nproc-per-node", std::to_string(o.nproc), "--store", store, "--job-id", job,
                                     "--secret-file", secret_file, "--run-dir", dir + "/run", "--http", "off",
                                     "--max-restarts", "100", "--reconnect-window", "0", "--", "/bin/true"};
    std::vector<char*> cargs;
    for (auto& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  auto kill_controller = [&] {
    kill(controller, SIGCONT);
    kill(controller, SIGTERM);
    int st = 0;
    for (int i = 0; i < 200 && waitpid(controller, &st, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(controller, SIGKILL);
    waitpid(controller, &st, 0);
  };

  std::printf("fleet_load_bench: %d nodes x %d ranks (%d ranks) against %s, controller pid %d, logs in %s\n",
              o.nodes, o.nproc, o.nodes * o.nproc, address.c_str(), controller, dir.c_str());
  std::vector<std::unique_ptr<SimAgent>> agents;
  agents.reserve(o.nodes);
  auto t_connect = Steady::now();
  for (int i = 0; i < o.nodes; ++i) {
    auto a = std::make_unique<SimAgent>(i, o);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection per agent, as on real nodes
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    a->channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    if (i == 0 && !a->channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
      std::fprintf(stderr, "the controller did not listen within 30 s (see %s/controller.log)\n", dir.c_str());
      kill_controller();
      return 1;
    }
    a->stub_ = v1::Controller::NewStub(a->channel_);
    agents.push_back(std::move(a));
  }
  for (auto& a : agents) a->Connect(a->stub_.get(), secret);
  bool all_started = WaitFor([&] {
    for (auto& a : agents) if (a->starts_ < 1) return false;
    return true;
  }, 120 + o.nodes / 50.0);
  double start_all_s = Since(t_connect, Steady::now());
  if (!all_started) {
    int got = 0;
    for (auto& a : agents) got += a->starts_ >= 1;
    std::fprintf(stderr, "only %d of %d nodes got their Start (see %s/controller.log)\n", got, o.nodes, dir.c_str());
    kill_controller();
    return 1;
  }
  std::printf("  connect -> every node's Start: %.2f s\n", start_all_s);
  const size_t hb_bytes = agents[0]->Heartbeat(1).ByteSizeLong();

  // Heartbeats: every node once a second, spread evenly over the second.
  std::atomic<bool> beating{true};
  std::atomic<std::int64_t> heartbeats{0};
  std::thread beater([&] {
    auto t0 = Steady::now();
    std::int64_t step = 1;
    while (beating) {
      for (int i = 0; i < o.nodes && beating; ++i) {
        std::this_thread::sleep_until(t0 + std::chrono::microseconds(static_cast<std::int64_t>(1e6 * i / o.nodes)));
        SimAgent& a = *agents[i];
        if (a.closed_by_controller_) continue;
        a.Send(a.Heartbeat(step));
        if (o.timings && a.running_) a.Send(a.Timings(step));
        heartbeats++;
      }
      t0 += std::chrono::seconds(1);
      step++;
      std::this_thread::sleep_until(t0);
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(3));  // warm up
  ProcStats before = ReadProc(controller);
  double self_before = SelfCpu();
  std::int64_t hb_before = heartbeats;
  auto t_steady = Steady::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.steady_s));
  ProcStats after = ReadProc(controller);
  double steady_wall = Since(t_steady, Steady::now());
  double hb_rate = (heartbeats - hb_before) / steady_wall;
  double core = (after.cpu_s - before.cpu_s) / steady_wall;
  std::printf("  steady heartbeats (%zu bytes each, %.0f/s%s): controller %.1f %% of a core, %.1f us CPU per heartbeat, "
              "RSS %.0f MiB, %d threads; load generator %.1f %% of a core\n",
              hb_bytes, hb_rate, o.timings ? ", with timings" : "", 100 * core, 1e6 * core / hb_rate,
              after.rss_kb / 1024.0, after.threads, 100 * (SelfCpu() - self_before) / steady_wall);

  if (o.stall_s > 0) {
    kill(controller, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.stall_s));
    kill(controller, SIGCONT);
    std::this_thread::sleep_for(std::chrono::seconds(8));  // past 5 missed heartbeats
    int dropped = 0;
    for (auto& a : agents) dropped += a->closed_by_controller_ ? 1 : 0;
    std::printf("  controller frozen (SIGSTOP) for %.0f s: %d node(s) dropped after it went on\n", o.stall_s, dropped);
  }

  // --lock-store: another process holds the job's SQLite store locked
  // (BEGIN EXCLUSIVE) through the failure and the restart: a slow store.
  sqlite3* locker = nullptr;
  if (o.lock_store) {
    if (sqlite3_open(store.c_str(), &locker) != SQLITE_OK ||
        sqlite3_exec(locker, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "cannot lock the store %s: %s\n", store.c_str(), sqlite3_errmsg(locker));
      kill_controller();
      return 1;
    }
    std::printf("  the store is locked by another process from here to the restart\n");
  }
  // A failure: rank 0 exits 1.
  for (auto& a : agents) a->stops_ = 0;
  int starts_before = agents[0]->starts_;
  auto t_fail = Steady::now();
  agents[0]->Send(agents[0]->Failure());
  bool all_stopped = WaitFor([&] {
    for (auto& a : agents) if (a->stops_ < 1 && !a->closed_by_controller_) return false;
    return true;
  }, 60);
  bool all_restarted = WaitFor([&] {
    for (auto& a : agents) if (a->starts_ <= starts_before && !a->closed_by_controller_) return false;
    return true;
  }, 60);
  std::vector<double> stop_ms, start_s;
  for (auto& a : agents) {
    if (a->stops_ > 0) stop_ms.push_back(1e3 * Since(t_fail, a->last_stop_));
    if (a->starts_ > starts_before) start_s.push_back(Since(t_fail, a->last_start_));
  }
  std::printf("  failure -> every node's Stop: p50 %.0f ms, p99 %.0f ms, max %.0f ms (%zu of %d nodes)%s\n",
              Percentile(stop_ms, 0.5), Percentile(stop_ms, 0.99), Percentile(stop_ms, 1.0), stop_ms.size(), o.nodes,
              all_stopped ? "" : " NOT ALL");
  std::printf("  failure -> every node restarted (its next Start): %.2f s (%zu of %d nodes)%s\n",
              Percentile(start_s, 1.0), start_s.size(), o.nodes, all_restarted ? "" : " NOT ALL");
  if (locker != nullptr) {
    sqlite3_exec(locker, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(locker);
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ProcStats end = ReadProc(controller);
  beating = false;
  beater.join();
  int dropped = 0;
  for (auto& a : agents) dropped += a->closed_by_controller_ ? 1 : 0;
  kill_controller();
  for (auto& a : agents) a->End();

  int lost_events = -1, stalls = -1;
  if (auto s = OpenEventStore(store); s.ok()) {
    if (auto events = (*s)->EventsAfter(job, 0, -1); events.ok()) {
      lost_events = stalls = 0;
      std::int64_t failure_ns = 0;
      std::string timeline;
      for (const auto& e : *events) {
        lost_events += e.kind == "node_lost" ? 1 : 0;
        stalls += e.kind == "controller_stalled" ? 1 : 0;
        if (e.kind == "failure") failure_ns = e.wall_ns;
        // Where the restart's time goes, from the controller's own record.
        if (failure_ns > 0 && (e.kind == "stopped" || e.kind == "attribution" || e.kind == "decision" ||
                               e.kind == "generation_started")) {
          char b[96];
          std::snprintf(b, sizeof b, "%s%s +%.0f ms", timeline.empty() ? "" : ", ", e.kind.c_str(),
                        (e.wall_ns - failure_ns) / 1e6);
          timeline += b;
        }
        if (e.kind == "generation_started" && failure_ns > 0) failure_ns = 0;
      }
      std::printf("  the controller's record of the failure: failure +0 ms, %s\n", timeline.c_str());
    }
  }
  std::printf("  healthy nodes dropped by the controller: %d (node_lost events: %d); controller peak RSS %.0f MiB, "
              "%d threads\n",
              dropped, lost_events, end.rss_kb / 1024.0, end.threads);
  std::printf("RESULT nodes=%d ranks=%d start_all_s=%.2f core=%.3f us_per_hb=%.1f stop_p50_ms=%.0f stop_p99_ms=%.0f "
              "stop_max_ms=%.0f restart_s=%.2f dropped=%d node_lost=%d stalls=%d rss_mib=%.0f threads=%d\n",
              o.nodes, o.nodes * o.nproc, start_all_s, core, 1e6 * core / hb_rate, Percentile(stop_ms, 0.5),
              Percentile(stop_ms, 0.99), Percentile(stop_ms, 1.0), Percentile(start_s, 1.0), dropped, lost_events, stalls,
              end.rss_kb / 1024.0, end.threads);
  std::filesystem::remove_all(dir);
  return all_stopped && all_restarted && dropped == 0 ? 0 : 1;
}
