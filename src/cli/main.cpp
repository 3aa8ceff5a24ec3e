// Entry point of the `tachyon` command.
#include <cstdio>

int main(int argc, char** argv) {
  std::fprintf(stderr, "tachyon: no command yet\n");
  return 1;
}
