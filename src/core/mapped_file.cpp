#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tachyon {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, "{}: cannot open: {}", path,
                      std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(ErrorCode::kIo, "{}: cannot stat: {}", path, std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kInvalidArgument, "{}: is a directory, expected a file", path);
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error(ErrorCode::kIo, "{}: mmap of {} bytes failed: {}", path, file->size_, std::strerror(err));
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    // An ifstream opens a directory and reads it as empty.
    return make_error(ErrorCode::kInvalidArgument, "{}: is a directory, not a file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kNotFound, "{}: cannot open for reading", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIo, "{}: read failed", path);
  return ss.str();
}

}  // namespace tachyon
