#include "common/job_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace trainguard {
namespace {

TEST(JobSecretTest, NewSecretsAreLongAndDifferent) {
  auto a = NewJobSecret(), b = NewJobSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 48u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
}

TEST(JobSecretTest, WrittenForThisUserOnlyAndReadBackWithoutWhiteSpace) {
  const std::string dir = testing::TempDir() + "/job_secret_test_" + std::to_string(getpid());
  const std::string path = dir + "/sub/secret";
  {
    std::ofstream wide(dir + "/x");  // the directory is made on the way
  }
  ASSERT_TRUE(WriteJobSecret(path, "abc123").ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  chmod(path.c_str(), 0644);
  ASSERT_TRUE(WriteJobSecret(path, "def456").ok());  // replaced, and narrowed again
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto read = ReadJobSecret(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "def456");
  std::ofstream(dir + "/blank") << " \n\t\n";
  EXPECT_NE(ReadJobSecret(dir + "/blank").status().message().find("is empty"), std::string::npos);
  EXPECT_NE(ReadJobSecret(dir + "/none").status().message().find(dir + "/none cannot be read"), std::string::npos);
  symlink(path.c_str(), (dir + "/link").c_str());
  EXPECT_FALSE(WriteJobSecret(dir + "/link", "x").ok());  // never through a link
  std::filesystem::remove_all(dir);
}

TEST(JobSecretTest, MatchesOnlyTheWholeSecret) {
  EXPECT_TRUE(SecretMatches("s3cret", "s3cret"));
  EXPECT_FALSE(SecretMatches("s3cret", "s3cre"));
  EXPECT_FALSE(SecretMatches("s3cret", "s3creT"));
  EXPECT_FALSE(SecretMatches("s3cret", ""));
  EXPECT_FALSE(SecretMatches("", ""));  // no secret: nothing matches
}

}  // namespace
}  // namespace trainguard
