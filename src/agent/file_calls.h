// Which system calls wait on a file, from the architecture's own table of
// system calls (<sys/syscall.h>, every SYS_<name>, generated at build time):
// each is classified here by name, as a call on a file descriptor (which
// argument holds it), a call on a file that names no descriptor (a path, or
// the whole file system: sync, msync), or not a file call. A call of the
// architecture that is none of these fails a unit test
// (EveryCallOfTheArchitectureIsClassified): a C library that gains a call
// (preadv2, pwritev2 and openat2 came after the calls before them) cannot
// leave it unrecognised.
#pragma once

#include <string>
#include <vector>

namespace trainguard {

// The name of a file system call by its number on this architecture ("" if
// it is not one), and which argument holds its file descriptor (-1: none;
// a path, in the process's memory, which is not read).
struct FileCall {
  std::string name;
  int fd_arg = -1;
};
FileCall FileCallOf(long number);

// The name of any system call by its number on this architecture ("" if unknown).
std::string SystemCallName(long number);

// The architecture's calls that are classified neither way (for the test).
std::vector<std::string> UnclassifiedSystemCalls();
// How many calls the architecture has (for the test).
int SystemCallCount();

}  // namespace trainguard
