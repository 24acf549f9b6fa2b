// trainguard._core: the client API and the checkpoint engine for Python.
// trainguard/__init__.py and trainguard/checkpoint.py wrap it. A non-OK
// Status becomes a RuntimeError here, and only here.
#include <sys/mman.h>

#include <cstring>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/op_journal.h"
#include "common/status_page.h"
#include "trainguard/checkpoint.h"
#include "trainguard/client.h"

namespace py = pybind11;
using namespace trainguard;

namespace {

void ThrowIfError(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.message());
}

py::dict ManifestDict(const RankManifest& m) {
  py::list tensors;
  for (const auto& t : m.tensors) {
    py::dict d;
    d["name"] = t.name;
    d["dtype"] = t.dtype;
    d["shape"] = t.shape;
    d["offset"] = t.offset;
    d["nbytes"] = t.nbytes;
    tensors.append(d);
  }
  py::dict d;
  d["step"] = m.step;
  d["attempt"] = m.attempt;
  d["sequence"] = m.sequence;
  d["rank"] = m.rank;
  d["world_size"] = m.world_size;
  d["replica_group"] = m.replica_group;
  d["total_bytes"] = m.total_bytes;
  d["blob_offset"] = m.blob_offset;
  d["blob_nbytes"] = m.blob_nbytes;
  d["tensors"] = tensors;
  d["lo"] = m.lo;
  d["hi"] = m.hi;
  return d;
}

// A status page and its journal as the agent reads them (tests, benchmarks).
py::dict ReadPage(const std::string& path) {
  auto mapped = MappedStatusPage::Open(path);
  ThrowIfError(mapped.status());
  const StatusPage& page = *mapped->get();
  StatusSnapshot snap = ReadStatusPage(page);
  JournalSnapshot j = ReadJournal(page.journal);
  py::dict d;
  d["pid"] = snap.pid;
  d["step"] = snap.step;
  d["step_count"] = snap.step_count;
  d["first_step"] = snap.first_step;
  d["phase"] = snap.phase;
  d["files_opened"] = snap.files_opened;
  py::list groups;
  for (const auto& g : j.groups) {
    py::dict gd;
    gd["id"] = g.id;
    gd["name"] = g.name;
    gd["members"] = g.members;
    gd["issued"] = g.issued;
    gd["completed"] = g.completed;
    groups.append(gd);
  }
  d["groups"] = groups;
  py::list peers;
  for (const auto& p : j.peers) {
    py::dict pd;
    pd["peer"] = p.peer;
    pd["sends"] = p.sends;
    pd["recvs"] = p.recvs;
    peers.append(pd);
  }
  d["peers"] = peers;
  py::list ops;
  for (const auto& o : j.ops) {
    py::dict od;
    od["group_id"] = o.group_id;
    od["seq"] = o.seq;
    od["op"] = OpKindName(o.kind);
    od["dtype"] = DtypeName(o.dtype);
    od["numel"] = o.numel;
    od["peer"] = o.peer;
    od["in_flight"] = o.completed_mono_ns == 0;
    od["on_device"] = o.on_device;
    od["started_ms"] = o.started_ms;
    ops.append(od);
  }
  d["ops"] = ops;
  d["dropped"] = j.dropped;
  return d;
}

// Every audit event of the interpreter passes here (a C hook, no Python
// frame; with any hook the interpreter builds each event's arguments, about
// 50-60 ns: bench/audit_hook_bench.py); "open" is raised by open(), os.open() and
// io.open_code() (imports). Forked data loader workers inherit the hook and
// the page, so their files count for the rank.
int CountOpens(const char* event, PyObject* /*args*/, void* /*data*/) {
  if (event[0] == 'o' && std::strcmp(event, "open") == 0) client::FileOpened();
  return 0;
}

bool InitAndCountOpens() {
  static bool hooked = false;
  const bool attached = client::Init();
  if (attached && !hooked) hooked = PySys_AddAuditHook(&CountOpens, nullptr) == 0;
  return attached;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "trainguard client core: status page writer and checkpoint engine";
  m.def("init", &InitAndCountOpens,
        "Attach to the agent's status page and count the files the process opens; False without one.");
  m.def("attached", &client::Attached);
  m.def("step", &client::Step, py::arg("step"));
  m.def("automatic_step", &client::AutomaticStep, py::arg("step"));
  m.def("set_phase", [](const std::string& name) { client::SetPhase(name.c_str()); },
        py::arg("name"));
  m.def("last_step", &client::LastStep);
  m.def("record_device_time", [](const std::string& name, std::int64_t start_mono_ns,
                                 std::int64_t duration_ns, std::int64_t after_step) {
          client::RecordDeviceTime(name.c_str(), start_mono_ns, duration_ns, after_step);
        },
        py::arg("name"), py::arg("start_mono_ns"), py::arg("duration_ns"), py::arg("after_step"));
  m.def("monotonic_ns", &MonotonicNowNanos, "CLOCK_MONOTONIC, the clock of the status page.");
  m.def("checkpoint_committed", &client::CheckpointCommitted, py::arg("step"));
  m.def("add_checkpoint_overhead", &client::AddCheckpointOverhead, py::arg("nanos"));
  m.def("shutdown", &client::Shutdown);
  m.def("mark_startup", &client::MarkStartup, py::arg("mark"),
        "Start-up mark: 0 script start, 1/2 process-group init begin/end, 3/4 checkpoint restore begin/end.");
  m.def("resumed_from", &client::ResumedFrom, py::arg("step"));
  m.def("report_fingerprint", &client::ReportFingerprint, py::arg("step"), py::arg("fingerprint"));
  m.def("report_numeric", &client::ReportNumeric, py::arg("step"), py::arg("kind"), py::arg("value"));
  m.def("numeric_observed", &client::NumericObserved);
  m.def("checkpoint_plan_ms", [] {
    std::int64_t memory_ms = 0, storage_ms = 0;
    client::CheckpointPlanMs(&memory_ms, &storage_ms);
    return std::make_pair(memory_ms, storage_ms);
  }, "The controller's checkpoint plan from the status page: (memory, storage) milliseconds, 0 = none.");
  m.def("_set_checkpoint_plan", [](const std::string& path, std::int64_t memory_ms, std::int64_t storage_ms) {
    auto mapped = MappedStatusPage::Open(path);
    ThrowIfError(mapped.status());
    mapped->get()->plan_memory_interval_ms.store(memory_ms, std::memory_order_release);
    mapped->get()->plan_storage_interval_ms.store(storage_ms, std::memory_order_release);
  }, py::arg("path"), py::arg("memory_ms"), py::arg("storage_ms"),
        "Writes a checkpoint plan into a status page as the agent does (tests).");
  m.def("fingerprint", [](const std::vector<std::pair<std::uintptr_t, std::size_t>>& buffers) {
    // XXH3 over the raw bytes of every buffer, in order: one bit anywhere changes it.
    py::gil_scoped_release release;
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (const auto& [ptr, size] : buffers) XXH3_64bits_update(state, reinterpret_cast<const void*>(ptr), size);
    std::uint64_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return h;
  }, py::arg("buffers"), "XXH3 of the bytes of (address, size) buffers in host memory, in order.");
  m.def("journal_group", &client::JournalGroup, py::arg("id"), py::arg("name"), py::arg("members"));
  m.def("journal_issue", &client::JournalIssue, py::arg("group_slot"), py::arg("op"),
        py::arg("dtype"), py::arg("numel"), py::arg("peer"), py::arg("on_device") = false);
  m.def("journal_started", &client::JournalStarted, py::arg("token"));
  m.def("journal_complete", &client::JournalComplete, py::arg("token"));
  m.def("_create_status_page",
        [](const std::string& path) { ThrowIfError(MappedStatusPage::Create(path).status()); },
        py::arg("path"), "Creates an empty status page as the agent does (tests, benchmarks).");
  m.def("_read_status_page", &ReadPage, py::arg("path"),
        "A status page with its journal, as the agent reads it (tests, benchmarks).");
  m.def("_read_timings", [](const std::string& path) {
          auto mapped = MappedStatusPage::Open(path);
          ThrowIfError(mapped.status());
          TimingCursor cursor;
          py::list out;
          for (const TimingSample& t : cursor.Drain(mapped.value().get()->timings)) {
            py::dict d;
            d["name"] = t.name;
            d["kind"] = t.kind == TimingKind::kStep ? "step" : t.kind == TimingKind::kGpu ? "gpu"
                        : t.kind == TimingKind::kCpu ? "cpu" : "phase";
            d["start_mono_ns"] = t.start_mono_ns;
            d["duration_ns"] = t.duration_ns;
            d["after_step"] = t.after_step;
            d["step"] = t.step;
            out.append(d);
          }
          return out;
        },
        py::arg("path"), "The records in a status page's timing ring, oldest first (tests).");
  m.def("op_code", [](const std::string& name) { return static_cast<int>(OpKindFromName(name)); },
        py::arg("name"));
  m.def("dtype_code", [](const std::string& name) { return static_cast<int>(DtypeCode(name)); },
        py::arg("name"));

  py::class_<CheckpointEngine>(m, "CheckpointEngine")
      .def(py::init([](const std::string& dir, int keep_last, int copy_threads, int writer_threads,
                       const std::string& overflow, double commit_timeout_s, bool report,
                       const std::string& memory_dir, int memory_keep) {
             CheckpointOptions o;
             o.dir = dir;
             o.keep_last = keep_last;
             o.copy_threads = copy_threads;
             o.writer_threads = writer_threads;
             if (overflow != "block" && overflow != "skip") {
               throw std::invalid_argument("overflow must be 'block' or 'skip', got '" + overflow + "'");
             }
             o.overflow = overflow == "skip" ? OverflowPolicy::kSkip : OverflowPolicy::kBlock;
             o.commit_timeout_s = commit_timeout_s;
             o.report_to_trainguard = report;
             o.memory_dir = memory_dir;
             o.memory_keep = memory_keep;
             auto engine = CheckpointEngine::Create(o);
             ThrowIfError(engine.status());
             return std::move(engine).value().release();
           }),
           py::arg("dir"), py::arg("keep_last") = 3, py::arg("copy_threads") = 4,
           py::arg("writer_threads") = 4, py::arg("overflow") = "block",
           py::arg("commit_timeout_s") = 600.0, py::arg("report") = true, py::arg("memory_dir") = "",
           py::arg("memory_keep") = 1)
      // tensors: [(name, dtype, shape, data_ptr, nbytes, on_device)]. The
      // caller keeps the tensors alive until save() returns. device_stream:
      // the cudaStream_t that produced the device tensors (0: legacy default). Returns False
      // if the save was skipped (overflow="skip").
      .def("save",
           [](CheckpointEngine& e, std::int64_t step, int rank, int world_size,
              std::vector<int> group,
              const std::vector<std::tuple<std::string, std::string, std::vector<std::int64_t>,
                                           std::uintptr_t, std::uint64_t, bool>>& tensors,
              const py::bytes& blob, const std::string& attempt, std::int64_t sequence,
              std::uintptr_t device_stream, bool memory_only) {
             SaveRequest req;
             req.memory_only = memory_only;
             req.device_stream = reinterpret_cast<void*>(device_stream);
             req.step = step;
             req.attempt = attempt;
             req.sequence = sequence;
             req.rank = rank;
             req.world_size = world_size;
             req.replica_group = std::move(group);
             req.blob = std::string(blob);
             for (const auto& [name, dtype, shape, ptr, nbytes, device] : tensors) {
               req.tensors.push_back({name, dtype, shape, reinterpret_cast<const void*>(ptr),
                                      nbytes, device});
             }
             Status s;
             {
               py::gil_scoped_release release;
               s = e.Save(req);
             }
             if (s.code() == StatusCode::kFailedPrecondition &&
                 s.message().find("skipped") != std::string::npos) {
               return false;
             }
             ThrowIfError(s);
             return true;
           },
           py::arg("step"), py::arg("rank"), py::arg("world_size"), py::arg("group"), py::arg("tensors"),
           py::arg("blob"), py::arg("attempt"), py::arg("sequence"), py::arg("device_stream") = 0,
           py::arg("memory_only") = false)
      .def("settle_memory",
           [](CheckpointEngine& e) {
             std::vector<MemorySave> settled;
             {
               py::gil_scoped_release release;
               settled = e.SettleMemory();
             }
             py::list out;
             for (const auto& m : settled) out.append(py::make_tuple(m.step, m.attempt, m.sequence, m.ok));
             return out;
           },
           "Waits for a save to memory alone in flight; [(step, attempt, sequence, ok)] written since the last call.")
      .def("commit_memory",
           [](CheckpointEngine& e, std::int64_t step, const std::string& attempt, std::int64_t sequence,
              bool everywhere) {
             MemorySave m{step, attempt, sequence, true};
             Status s;
             {
               py::gil_scoped_release release;
               s = e.CommitMemory(m, everywhere);
             }
             return s.ok() ? std::string() : s.message();
           },
           py::arg("step"), py::arg("attempt"), py::arg("sequence"), py::arg("everywhere"),
           "Commits (everywhere) or drops a settled save to memory alone; '' or the error.")
      .def("wait",
           [](CheckpointEngine& e) {
             Status s;
             {
               py::gil_scoped_release release;
               s = e.Wait();
             }
             return s.ok() ? std::string() : s.message();
           },
           "Waits for every queued save; returns '' or the first error since the last wait.")
      .def("stats", [](const CheckpointEngine& e) {
        CheckpointStats s = e.stats();
        py::dict d;
        d["saves"] = s.saves;
        d["skipped"] = s.skipped;
        d["blocked"] = s.blocked;
        d["failed"] = s.failed;
        d["abandoned"] = s.abandoned;
        d["last_committed_step"] = s.last_committed_step;
        d["bytes_written"] = s.bytes_written;
        d["last_snapshot_s"] = s.last_snapshot_s;
        d["last_persist_s"] = s.last_persist_s;
        d["last_blocked_s"] = s.last_blocked_s;
        d["last_memory_persist_s"] = s.last_memory_persist_s;
        d["memory_commits"] = s.memory_commits;
        d["last_error"] = s.last_error;
        return d;
      });

  m.def("list_checkpoints", [](const std::string& dir) {
    auto list = ListCheckpoints(dir);
    ThrowIfError(list.status());
    py::list out;
    for (const auto& c : *list) {
      py::dict d;
      d["step"] = c.step;
      d["path"] = c.path;
      d["committed"] = c.committed;
      d["complete"] = c.complete;
      d["problem"] = c.problem;
      d["save"] = c.save;
      d["world_size"] = c.world_size;
      d["manifests"] = c.manifests;
      d["bytes"] = c.bytes;
      out.append(d);
    }
    return out;
  });
  m.def("read_manifest", [](const std::string& dir, std::int64_t step, int rank) {
    auto man = ReadManifest(dir, step, rank);
    ThrowIfError(man.status());
    return ManifestDict(*man);
  });
  // Reads what `rank` stored of step `step` in save (attempt, sequence), as
  // read_manifest named it, into the writable buffer at address `ptr` of
  // `size` bytes, verifying checksums.
  m.def("read_stored_range", [](const std::string& dir, std::int64_t step, int rank,
                                const std::string& attempt, std::int64_t sequence,
                                std::uintptr_t ptr, std::uint64_t size, int threads,
                                const std::string& memory_dir) {
    RankManifest which;
    which.step = step;
    which.rank = rank;
    which.attempt = attempt;
    which.sequence = sequence;
    Status s;
    std::string source, memory_problem;
    {
      py::gil_scoped_release release;
      s = ReadStoredRange(dir, which, reinterpret_cast<void*>(ptr), size, threads, memory_dir, &source,
                          &memory_problem);
    }
    ThrowIfError(s);
    return py::make_tuple(source, memory_problem);
  }, py::arg("dir"), py::arg("step"), py::arg("rank"), py::arg("attempt"), py::arg("sequence"),
     py::arg("ptr"), py::arg("size"), py::arg("threads") = 4, py::arg("memory_dir") = "",
     "Reads and verifies a rank's stored range; from the node's memory copy when `memory_dir` has one "
     "that verifies. Returns (source, why a memory copy was not used).");
  // A node memory copy mapped and verified in place (MapMemoryCopy): a
  // writable buffer (copy-on-write) that torch.frombuffer wraps without a copy.
  struct MappedCopy {
    MappedRange range;
    ~MappedCopy() {
      if (range.data != nullptr) munmap(range.data, range.size);
    }
  };
  py::class_<MappedCopy>(m, "MappedCopy", py::buffer_protocol())
      .def_buffer([](MappedCopy& c) {
        return py::buffer_info(c.range.data, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(c.range.size)}, {1});
      })
      .def("__len__", [](const MappedCopy& c) { return c.range.size; })
      .def_property_readonly("origin", [](const MappedCopy& c) { return c.range.origin; },
                             "'' for the node's own copy, else the node whose memory it was fetched from");
  m.def("map_memory_copy", [](const std::string& dir, std::int64_t step, int rank, const std::string& attempt,
                              std::int64_t sequence, const std::string& memory_dir, int threads) -> py::tuple {
    RankManifest which;
    which.step = step;
    which.rank = rank;
    which.attempt = attempt;
    which.sequence = sequence;
    StatusOr<MappedRange> mapped = NotFound("");
    {
      py::gil_scoped_release release;
      mapped = MapMemoryCopy(dir, which, memory_dir, threads);
    }
    if (!mapped.ok()) return py::make_tuple(py::none(), std::string(mapped.status().message()));
    auto copy = std::make_unique<MappedCopy>();
    copy->range = *mapped;
    return py::make_tuple(py::cast(std::move(copy)), std::string());
  }, py::arg("dir"), py::arg("step"), py::arg("rank"), py::arg("attempt"), py::arg("sequence"),
     py::arg("memory_dir"), py::arg("threads") = 4,
     "The node's memory copy of a rank's committed range, mapped and verified: (MappedCopy, '') or "
     "(None, why not; '' when the memory holds nothing of the step).");
  m.def("memory_saves", [](const std::string& memory_dir, int rank) {
    py::list out;
    for (const auto& m : ListMemorySaves(memory_dir, rank)) out.append(py::make_tuple(m.step, m.attempt, m.sequence));
    return out;
  }, py::arg("memory_dir"), py::arg("rank"),
     "[(step, attempt, sequence)] of the saves to memory alone `rank` committed in the node's memory, newest first.");
  m.def("map_memory_save", [](const std::string& memory_dir, std::int64_t step, int rank, const std::string& attempt,
                              std::int64_t sequence, int threads) -> py::tuple {
    StatusOr<MemoryRestore> got = NotFound("");
    {
      py::gil_scoped_release release;
      got = MapMemorySave(memory_dir, step, rank, attempt, sequence, threads);
    }
    if (!got.ok()) return py::make_tuple(py::none(), py::none(), std::string(got.status().message()));
    auto copy = std::make_unique<MappedCopy>();
    copy->range = got->range;
    return py::make_tuple(ManifestDict(got->manifest), py::cast(std::move(copy)), std::string());
  }, py::arg("memory_dir"), py::arg("step"), py::arg("rank"), py::arg("attempt"), py::arg("sequence"),
     py::arg("threads") = 4,
     "A save to memory alone, verified against its own commit and manifest: (manifest, MappedCopy, '') or "
     "(None, None, why not).");
  m.def("verify_checkpoint", [](const std::string& dir, std::int64_t step) {
    Status s = VerifyCheckpoint(dir, step);
    return s.ok() ? std::string() : s.message();
  });
}
