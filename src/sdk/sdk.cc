// libtrainguard.so is made of the client and checkpoint libraries whole;
// this file only gives the shared library a translation unit of its own.
namespace trainguard {
extern const char kSdkName[] = "trainguard";
}  // namespace trainguard
