// A minimal RASR-style consumer of an onnx_compat model in C++ (ONNX Runtime's C++ API, as RASR links it).
//
//   rasr_consumer MODEL.onnx FEATURES.f32 B T F LENGTHS.i32 OUT_PREFIX
//
// In:  "data" float32 [B, T, F] and "data:size1" int32 [B] (raw little-endian files).
// Out: OUT_PREFIX.f32 ("output") and OUT_PREFIX.i32 ("output:size1"); prints their shapes as JSON.
// One intra-op and one inter-op thread, as RASR runs its sessions.
#include <onnxruntime_cxx_api.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

template <typename T>
static std::vector<T> read_file(const std::string &path, size_t count) {
  std::vector<T> data(count);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char *>(data.data()), count * sizeof(T))) throw std::runtime_error("short file " + path);
  return data;
}

template <typename T>
static void write_file(const std::string &path, const Ort::Value &value) {
  size_t count = value.GetTensorTypeAndShapeInfo().GetElementCount();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(value.GetTensorData<T>()), count * sizeof(T));
}

int main(int argc, char **argv) try {
  if (argc != 8) {
    std::cerr << "usage: " << argv[0] << " MODEL.onnx FEATURES.f32 B T F LENGTHS.i32 OUT_PREFIX\n";
    return 2;
  }
  const std::vector<int64_t> dims = {std::stoll(argv[3]), std::stoll(argv[4]), std::stoll(argv[5])};
  const std::vector<int64_t> batch = {dims[0]};
  auto features = read_file<float>(argv[2], dims[0] * dims[1] * dims[2]);
  auto lengths = read_file<int32_t>(argv[6], dims[0]);

  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "rasr_consumer");
  Ort::SessionOptions options;
  options.SetIntraOpNumThreads(1);
  options.SetInterOpNumThreads(1);
  Ort::Session session(env, argv[1], options);

  auto memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> inputs;
  inputs.push_back(Ort::Value::CreateTensor<float>(memory, features.data(), features.size(), dims.data(), dims.size()));
  inputs.push_back(Ort::Value::CreateTensor<int32_t>(memory, lengths.data(), lengths.size(), batch.data(), 1));
  const char *input_names[] = {"data", "data:size1"};
  const char *output_names[] = {"output", "output:size1"};
  auto outputs = session.Run(Ort::RunOptions{nullptr}, input_names, inputs.data(), 2, output_names, 2);

  write_file<float>(std::string(argv[7]) + ".f32", outputs[0]);
  write_file<int32_t>(std::string(argv[7]) + ".i32", outputs[1]);
  std::cout << "{\"output\": [";
  auto shape = outputs[0].GetTensorTypeAndShapeInfo().GetShape();
  for (size_t i = 0; i < shape.size(); ++i) std::cout << (i ? ", " : "") << shape[i];
  std::cout << "], \"lengths\": [";
  const int32_t *size = outputs[1].GetTensorData<int32_t>();
  for (int64_t i = 0; i < dims[0]; ++i) std::cout << (i ? ", " : "") << size[i];
  std::cout << "]}" << std::endl;
  return 0;
} catch (const std::exception &e) {
  std::cerr << e.what() << std::endl;
  return 1;
}
