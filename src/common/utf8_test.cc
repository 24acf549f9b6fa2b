#include "common/utf8.h"

#include <gtest/gtest.h>

#include <random>

namespace trainguard {
namespace {

TEST(Utf8Test, ValidTextIsKeptAsItIs) {
  for (std::string s : {"", "plain ascii", "loss 0.5 █▉▊ 45%|", "日本語", "emoji \xF0\x9F\x9A\x80"}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(ValidUtf8(s), s);
  }
}

TEST(Utf8Test, IllFormedBytesBecomeReplacementCharacters) {
  EXPECT_EQ(ValidUtf8("cut \xE2\x96"), "cut \xEF\xBF\xBD\xEF\xBF\xBD");    // a character cut short
  EXPECT_EQ(ValidUtf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");           // never valid bytes
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");           // overlong '/'
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80").size(), 12u);                   // above U+10FFFF
  EXPECT_EQ(ValidUtf8("ok\xE2\x96\x88ok\x80"), "ok\xE2\x96\x88ok\xEF\xBF\xBD");
}

TEST(Utf8Test, RandomBytesAlwaysComeOutValid) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(1 + gen() % 300, '\0');
    for (char& c : s) c = static_cast<char>(gen());
    EXPECT_TRUE(IsValidUtf8(ValidUtf8(s)));
  }
}

TEST(Utf8Test, NonTextShareTellsBinaryFromText) {
  EXPECT_EQ(NonTextShare("loss 0.51 \x1b[32m ok\r"), 0.0);
  EXPECT_EQ(NonTextShare("日本語"), 0.0);
  EXPECT_GT(NonTextShare(std::string("\x00\x01\xff\xfe ab", 7)), 0.5);
  std::mt19937 gen(3);
  std::string random(4096, '\0');
  for (char& c : random) c = static_cast<char>(gen());
  EXPECT_GT(NonTextShare(random), 0.3);
}

}  // namespace
}  // namespace trainguard
