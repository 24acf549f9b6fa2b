#include "store/step_timing_text.h"

#include <gtest/gtest.h>

namespace trainguard {
namespace {

TEST(StepTimingTextTest, IntervalsAndTotalsRoundTrip) {
  std::vector<TimedInterval> in = {
      {"forward", kIntervalPhase, 10, 300},
      {"all_reduce", kIntervalCollective, -5, 120, 0, 7, -1, 1000},
      {"forward", kIntervalDevice, 12, 280},
      {"send", kIntervalSend, 400, 30, 3, 2, 5, 64},
      {"forward", kIntervalPhase, 500, 100},
      {"a,b;c=d", kIntervalPhase, 700, 1},
      {"forward", kIntervalCpu, 10, 250},
  };
  auto out = DecodeIntervals(EncodeIntervals(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), in.size());
  EXPECT_EQ((*out)[1].name, "all_reduce");
  EXPECT_EQ((*out)[1].start_us, -5);
  EXPECT_EQ((*out)[1].seq, 7);
  EXPECT_EQ((*out)[3].peer, 5);
  EXPECT_EQ((*out)[3].numel, 64);
  EXPECT_EQ((*out)[5].name, "a_b_c_d");
  PhaseTotals totals = SumByKey(in);
  auto back = DecodeTotals(EncodeTotals(totals));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, (PhaseTotals{{"forward", 400}, {"comm:all_reduce", 120}, {"gpu:forward", 280},
                                {"comm:send", 30}, {"a_b_c_d", 1}, {"cpu:forward", 250}}));
}

TEST(StepTimingTextTest, BadTextIsAnErrorThatQuotesIt) {
  auto bad = DecodeIntervals("forward,1,x,3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("forward,1,x,3"), std::string::npos);
  EXPECT_FALSE(DecodeIntervals("forward,1,2").ok());
  EXPECT_FALSE(DecodeTotals("forward").ok());
  EXPECT_TRUE(DecodeIntervals("")->empty());
}

}  // namespace
}  // namespace trainguard
