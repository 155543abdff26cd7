// Runs an AOTInductor package with no Python: the inputs come from a file
// torch.save wrote (a list of tensors), the outputs go to one torch.load
// reads. The package's fastreduce operators resolve through the dispatcher
// to libfastreduce_ops, which this program links (and nothing else but
// LibTorch).
//   aoti_run MODEL.pt2 INPUTS.pt OUTPUTS.pt
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <iterator>

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error(std::string("cannot read ") + path);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt2 INPUTS.pt OUTPUTS.pt\n";
    return 2;
  }
  c10::InferenceMode inference;
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  std::vector<at::Tensor> inputs;
  const c10::IValue saved = torch::jit::pickle_load(read_file(argv[2]));
  for (const c10::IValue& input : saved.toListRef()) inputs.push_back(input.toTensor());
  const std::vector<at::Tensor> outputs = loader.run(inputs);
  // A tuple: lists carry a type tag that torch.load(weights_only=True) refuses.
  const std::vector<char> bytes =
      torch::jit::pickle_save(c10::ivalue::Tuple::create(std::vector<c10::IValue>(outputs.begin(), outputs.end())));
  std::ofstream(argv[3], std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::cout << "ran " << argv[1] << ": " << inputs.size() << " inputs, " << outputs.size() << " outputs\n";
  return 0;
}
