#include "agent/memory_peer.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/tcp.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;

std::string Read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void Write(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Bytes(std::size_t n, char seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 31 + (i >> 12));
  return s;
}

class MemoryPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tg-memory-peer-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A store in the fallback directory (the test need not be root).
  std::unique_ptr<MemoryStore> Store(const std::string& name) {
    auto s = std::make_unique<MemoryStore>(dir_.string(), false);
    EXPECT_TRUE(s->Open(name).ok());
    return s;
  }
  fs::path dir_;
};

TEST(CopyPathTest, OnlyCanonicalCopyPathsParse) {
  CopyPath p;
  ASSERT_TRUE(ParseCopyPath("step-000000000020/save-a1-3/rank-00007.data", &p));
  EXPECT_EQ(p.step, 20);
  EXPECT_EQ(p.save_dir, "save-a1-3");
  EXPECT_EQ(p.rank, 7);
  for (const char* bad : {"step-20/save-a1-3/rank-00007.data", "step-000000000020/save-a1-3/rank-7.data",
                          "step-000000000020/../rank-00007.data", "step-000000000020/save-a1-3/rank-00007.dat",
                          "step-000000000020/save-a1-3/rank-00007.data.tmp", "/step-000000000020/save-a/rank-00007.data",
                          "step-000000000020/save-a1-3/x/rank-00007.data", "step-000000000020/save-a/b/rank-00007.data",
                          "step-000000000020/save-a1-3", "", "peer/step-000000000020/save-a1-3/rank-00007.data",
                          "step-000000000020/..save/rank-00007.data"}) {
    EXPECT_FALSE(ParseCopyPath(bad, &p)) << bad;
  }
  // A save to memory alone travels with its manifest and commit; nothing else does.
  ASSERT_TRUE(ParseCopyPath("step-000000000020/save-a1-3/rank-00007.commit", &p));
  EXPECT_EQ(p.kind, "commit");
  ASSERT_TRUE(ParseCopyPath("step-000000000020/save-a1-3/rank-00007.json", &p));
  EXPECT_EQ(p.kind, "json");
  for (const char* bad : {"step-000000000020/save-a1-3/rank-00007.commit.origin",
                          "step-000000000020/save-a1-3/rank-00007.sh", "step-000000000020/save-a1-3/rank-00007.",
                          "step-000000000020/save-a1-3/rank-00007.json/x"}) {
    EXPECT_FALSE(ParseCopyPath(bad, &p)) << bad;
  }
}

// A save to memory alone is pushed, kept and fetched whole: manifest, data,
// then the commit that binds them, never the commit first. One whose commit
// never came (its sender died) does not push out the older whole step, and
// is not what a replacement fetches.
TEST_F(MemoryPeerTest, ASaveToMemoryAloneTravelsWithItsManifestAndCommitLast) {
  auto sender = Store("sender"), holder = Store("holder"), replacement = Store("replacement");
  MemoryPeerServer server(holder.get(), "node0", "");
  ASSERT_TRUE(server.Start("127.0.0.1").ok());
  server.Accept(2, 2, 1);
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  const std::string base = "step-000000000030/save-b-4/rank-00002.";
  for (const char* kind : {"commit", "json", "data"}) Write(sender->Root() + "/" + base + kind, Bytes(100, kind[0]));
  const std::vector<std::string> in_order{base + "json", base + "data", base + "commit"};
  ASSERT_EQ(sender->OwnCopies(2, 30), in_order);
  for (const auto& relative : sender->OwnCopies(2, 30)) ASSERT_TRUE(PushCopy(peer, *sender, relative, 1, "", kSecond).ok());
  EXPECT_EQ(holder->NewestPeerCopies(2), in_order);
  auto fetched = FetchCopies(peer, {2}, replacement.get(), "", kSecond);
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  EXPECT_EQ(fetched->files, 3);
  for (const auto& relative : in_order) {
    EXPECT_EQ(Read(replacement->Root() + "/" + relative), Read(sender->Root() + "/" + relative)) << relative;
    EXPECT_EQ(Read(replacement->Root() + "/" + relative + ".origin"), "node0") << relative;
  }
  // Step 40's manifest and data arrive, its commit does not.
  const std::string half = "step-000000000040/save-b-5/rank-00002.";
  for (const char* kind : {"json", "data"}) {
    Write(sender->Root() + "/" + half + kind, Bytes(100, kind[0]));
    ASSERT_TRUE(PushCopy(peer, *sender, half + kind, 1, "", kSecond).ok());
  }
  EXPECT_TRUE(fs::exists(holder->Root() + "/peer/" + base + "commit")) << "the whole step 30 was pushed out";
  EXPECT_EQ(holder->NewestPeerCopies(2), in_order) << "a replacement would fetch half a save";
  // Once its commit comes, step 40 is whole and step 30 goes.
  Write(sender->Root() + "/" + half + "commit", "c");
  ASSERT_TRUE(PushCopy(peer, *sender, half + "commit", 1, "", kSecond).ok());
  EXPECT_FALSE(fs::exists(holder->Root() + "/peer/" + base + "commit"));
  EXPECT_EQ(holder->NewestPeerCopies(2).size(), 3u);
}

TEST_F(MemoryPeerTest, AStoreOfItsOwnIsATmpfsThatGoesWithIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs CAP_SYS_ADMIN";
  std::string root;
  {
    MemoryStore store(dir_.string());
    ASSERT_TRUE(store.Open("own").ok());
    root = store.Root();
    EXPECT_EQ(root.rfind("/proc/" + std::to_string(getpid()) + "/fd/", 0), 0u) << root;
    EXPECT_TRUE(store.huge_pages()) << store.Describe();
    struct statfs st;
    ASSERT_EQ(statfs(root.c_str(), &st), 0);
    EXPECT_EQ(st.f_type, 0x01021994) << "not a tmpfs";  // TMPFS_MAGIC
    Write(root + "/step-000000000001/save-a-1/rank-00000.data", Bytes(3 << 20, 1));
    EXPECT_EQ(store.Bytes(), 3 << 20);
    EXPECT_TRUE(store.HasOwnCopyOf({0}));
    EXPECT_FALSE(store.HasOwnCopyOf({1}));
    EXPECT_FALSE(fs::exists(dir_ / "own")) << "nothing was attached to a directory";
  }
  EXPECT_FALSE(fs::exists(root + "/step-000000000001")) << "the tmpfs outlived its store";
}

TEST_F(MemoryPeerTest, TheFallbackDirectoryIsRemovedWithTheStore) {
  { auto s = Store("fallback"); Write(s->Root() + "/x", "1"); EXPECT_EQ(s->Root(), (dir_ / "fallback").string()); }
  EXPECT_FALSE(fs::exists(dir_ / "fallback"));
}

// An agent killed (SIGKILL) cannot remove its fallback directory: the next
// agent on the host does, once nothing holds the lock inside it and it is
// 10 s old. A live agent's directory, one of an agent from before the lock
// and one just made stay.
TEST_F(MemoryPeerTest, AKilledAgentsCopiesAreRemovedByTheNextAgentAndNoOneElses) {
  auto live = Store("trainguard-j-n0-100-checkpoints");
  Write(live->Root() + "/step-000000000010/save-1-1/rank-0.data", "live");
  const fs::path killed = dir_ / "trainguard-j-n1-101-checkpoints";
  pid_t child = fork();
  if (child == 0) {
    MemoryStore store(dir_.string(), false);
    if (store.Open(killed.filename().string()).ok()) Write(store.Root() + "/step-000000000010/save-1-1/rank-1.data", "x");
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  Write((dir_ / "trainguard-j-n2-102-checkpoints" / "step-000000000010" / "save-1-1" / "rank-2.data").string(), "old");
  ASSERT_TRUE(fs::exists(killed / "step-000000000010" / "save-1-1" / "rank-1.data"));
  EXPECT_EQ(RemoveOrphanedCopies(dir_.string()), 0);  // just made: it may be a directory not yet locked
  const auto past = fs::file_time_type::clock::now() - std::chrono::seconds(20);
  fs::last_write_time(killed / ".agent-lock", past);
  fs::last_write_time(fs::path(live->Root()) / ".agent-lock", past);
  EXPECT_EQ(RemoveOrphanedCopies(dir_.string()), 1);
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_EQ(Read(live->Root() + "/step-000000000010/save-1-1/rank-0.data"), "live");
  EXPECT_TRUE(fs::exists(dir_ / "trainguard-j-n2-102-checkpoints"));
}

TEST_F(MemoryPeerTest, APeerKeepsTheNewestPushedStepsAndAReplacementFetchesThem) {
  auto sender = Store("sender"), holder = Store("holder"), replacement = Store("replacement");
  MemoryPeerServer server(holder.get(), "node0", "");
  ASSERT_TRUE(server.Start("127.0.0.1").ok());
  server.Accept(2, 2, 1);  // node1's ranks 2 and 3
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  const std::string step10 = "step-000000000010/save-a-1/rank-00002.data";
  const std::string step20 = "step-000000000020/save-a-2/rank-00002.data";
  const std::string rank3 = "step-000000000020/save-a-2/rank-00003.data";
  Write(sender->Root() + "/" + step10, Bytes(5 << 20, 3));
  Write(sender->Root() + "/" + step20, Bytes((5 << 20) + 17, 4));
  Write(sender->Root() + "/" + rank3, Bytes(1000, 5));
  EXPECT_EQ(sender->OwnCopies(2, 20), std::vector<std::string>{step20});

  ASSERT_TRUE(PushCopy(peer, *sender, step10, 1, "", kSecond).ok());
  EXPECT_EQ(holder->NewestPeerCopies(2), std::vector<std::string>{step10});
  ASSERT_TRUE(PushCopy(peer, *sender, step20, 1, "", kSecond).ok());
  ASSERT_TRUE(PushCopy(peer, *sender, rank3, 1, "", kSecond).ok());
  EXPECT_EQ(holder->NewestPeerCopies(2), std::vector<std::string>{step20});
  EXPECT_FALSE(fs::exists(holder->Root() + "/peer/step-000000000010")) << "keep 1: the older step goes";
  EXPECT_EQ(Read(holder->Root() + "/peer/" + step20), Read(sender->Root() + "/" + step20));

  EXPECT_FALSE(replacement->HasOwnCopyOf({2, 3}));
  auto fetched = FetchCopies(peer, {2, 3}, replacement.get(), "", kSecond);
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  EXPECT_EQ(fetched->files, 2);
  EXPECT_EQ(fetched->bytes, (5 << 20) + 17 + 1000);
  EXPECT_EQ(fetched->origin, "node0");
  EXPECT_TRUE(replacement->HasOwnCopyOf({3}));
  EXPECT_FALSE(replacement->HasOwnCopyOf({4}));
  EXPECT_EQ(Read(replacement->Root() + "/" + step20), Read(sender->Root() + "/" + step20));
  EXPECT_EQ(Read(replacement->Root() + "/" + step20 + ".origin"), "node0");
  EXPECT_FALSE(fs::exists(replacement->Root() + "/" + step20 + ".tmp"));

  // Ranks it holds nothing of: an empty answer, not an error.
  auto none = FetchCopies(peer, {6}, replacement.get(), "", kSecond);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->files, 0);
}

TEST_F(MemoryPeerTest, AServerRefusesStrangersBadPathsAndRanksItDoesNotKeep) {
  auto sender = Store("sender"), holder = Store("holder");
  MemoryPeerServer server(holder.get(), "node0", "s3cret");
  ASSERT_TRUE(server.Start("127.0.0.1").ok());
  server.Accept(2, 1, 1);
  const std::string peer = "127.0.0.1:" + std::to_string(server.port());
  const std::string rel = "step-000000000010/save-a-1/rank-00002.data";
  Write(sender->Root() + "/" + rel, Bytes(8 << 20, 7));  // larger than the socket buffers: the refusal cuts it short
  Status s = PushCopy(peer, *sender, rel, 1, "wrong", kSecond);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("secret"), std::string::npos) << s.message();
  auto f = FetchCopies(peer, {2}, sender.get(), "", kSecond);
  EXPECT_FALSE(f.ok());
  EXPECT_TRUE(holder->NewestPeerCopies(2).empty());

  Write(sender->Root() + "/step-000000000010/save-a-1/evil", "x");
  s = PushCopy(peer, *sender, "step-000000000010/save-a-1/evil", 1, "s3cret", kSecond);
  EXPECT_NE(s.message().find("not a copy's path"), std::string::npos) << s.message();
  const std::string other = "step-000000000010/save-a-1/rank-00003.data";  // not a rank it keeps
  Write(sender->Root() + "/" + other, Bytes(4096, 8));
  s = PushCopy(peer, *sender, other, 1, "s3cret", kSecond);
  EXPECT_NE(s.message().find("not one this node keeps"), std::string::npos) << s.message();
  EXPECT_TRUE(holder->NewestPeerCopies(3).empty());
  EXPECT_TRUE(PushCopy(peer, *sender, rel, 1, "s3cret", kSecond).ok());
  EXPECT_EQ(holder->NewestPeerCopies(2), std::vector<std::string>{rel});
}

TEST_F(MemoryPeerTest, AFullMemoryRefusesACopyAndTheServerGoesOn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  const fs::path small = dir_ / "small";
  fs::create_directories(small);
  ASSERT_EQ(mount("tmpfs", small.c_str(), "tmpfs", 0, "size=2m"), 0) << std::strerror(errno);
  {
    auto sender = Store("sender");
    MemoryStore holder(small.string(), false);
    ASSERT_TRUE(holder.Open("h").ok());
    MemoryPeerServer server(&holder, "node0", "");
    ASSERT_TRUE(server.Start("127.0.0.1").ok());
    server.Accept(0, 1, 1);
    const std::string peer = "127.0.0.1:" + std::to_string(server.port());
    const std::string big = "step-000000000010/save-a-1/rank-00000.data";
    const std::string fits = "step-000000000020/save-a-1/rank-00000.data";
    Write(sender->Root() + "/" + big, Bytes(8 << 20, 1));
    Write(sender->Root() + "/" + fits, Bytes(100 << 10, 2));
    Status s = PushCopy(peer, *sender, big, 1, "", kSecond);  // no SIGBUS: refused, said why
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(holder.NewestPeerCopies(0).empty());
    EXPECT_TRUE(PushCopy(peer, *sender, fits, 1, "", kSecond).ok());
    EXPECT_EQ(holder.NewestPeerCopies(0), std::vector<std::string>{fits});
  }
  ASSERT_EQ(umount(small.c_str()), 0);
}

TEST_F(MemoryPeerTest, NoServerIsAnErrorNamingThePeer) {
  auto store = Store("s");
  int port = 0;
  std::string error;
  int fd = Listen("127.0.0.1", &port, &error);  // a port nobody accepts on once closed
  close(fd);
  auto f = FetchCopies("127.0.0.1:" + std::to_string(port), {0}, store.get(), "", kSecond);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
}

}  // namespace
}  // namespace trainguard
