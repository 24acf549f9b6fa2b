#include "agent/error_file.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

TEST(ErrorFileTest, ReadsWhatTorchRecordWrites) {
  auto e = ParseErrorFile(R"({"message": {"message": "RuntimeError: CUDA error: an illegal memory access",
    "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3\nRuntimeError: CUDA error\n",
    "timestamp": "1712345678"}}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->type(), "RuntimeError");
  EXPECT_EQ(e->message(), "RuntimeError: CUDA error: an illegal memory access");
  EXPECT_NE(e->traceback().find("File \"t.py\", line 3"), std::string::npos);
  EXPECT_EQ(e->timestamp_unix_s(), 1712345678);
}

TEST(ErrorFileTest, AcceptsAPlainStringMessageAndAnErrorCode) {
  auto e = ParseErrorFile(R"({"message": "torch.distributed.DistBackendError: NCCL error", "errorCode": 1})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->type(), "torch.distributed.DistBackendError");
  EXPECT_EQ(e->traceback(), "");
}

TEST(ErrorFileTest, AMessageWithoutATypeHasNone) {
  auto e = ParseErrorFile(R"({"message": {"message": "something went wrong: badly"}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->type(), "");
  EXPECT_EQ(e->message(), "something went wrong: badly");
}

TEST(ErrorFileTest, TextThatIsNotTheFormatIsKeptAsTheMessageCutShort) {
  auto e = ParseErrorFile("{\"message\": {\"message\": \"Value" + std::string(10000, 'x'));  // cut off mid-write
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message().size(), 4096u);
  auto other = ParseErrorFile("plain words");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->message(), "plain words");
}

TEST(ErrorFileTest, NothingRecordedIsNoError) {
  EXPECT_FALSE(ParseErrorFile(""));
  EXPECT_FALSE(ParseErrorFile(" \n"));
  EXPECT_FALSE(ParseErrorFile(R"({"message": {"extraInfo": {}}})"));
  EXPECT_FALSE(ReadErrorFile("/nonexistent/error.json"));
}

}  // namespace
}  // namespace trainguard
