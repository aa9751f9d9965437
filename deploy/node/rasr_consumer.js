// A minimal RASR-style consumer of an onnx_compat model in Node.js (onnxruntime-node, the native library).
//
//   node rasr_consumer.js MODEL.onnx FEATURES.f32 B T F LENGTHS.i32 OUT_PREFIX
//
// In:  "data" float32 [B, T, F] and "data:size1" int32 [B] (raw little-endian files).
// Out: OUT_PREFIX.f32 (the "output" tensor) and OUT_PREFIX.i32 ("output:size1"); prints their shapes as JSON.
// The names follow onnx_compat's convention, which RASR's ONNX feature scorer reads.
const fs = require('fs');
const ort = require('onnxruntime-node');

function typed(file, Type) {
  const buf = fs.readFileSync(file);
  return new Type(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
}

async function main() {
  const [model, features, B, T, F, lengths, out] = process.argv.slice(2);
  const dims = [Number(B), Number(T), Number(F)];
  const session = await ort.InferenceSession.create(model);
  const result = await session.run({
    'data': new ort.Tensor('float32', typed(features, Float32Array), dims),
    'data:size1': new ort.Tensor('int32', typed(lengths, Int32Array), [dims[0]]),
  });
  const output = result['output'];
  const size = result['output:size1'];
  fs.writeFileSync(out + '.f32', Buffer.from(output.data.buffer, output.data.byteOffset, output.data.byteLength));
  fs.writeFileSync(out + '.i32', Buffer.from(size.data.buffer, size.data.byteOffset, size.data.byteLength));
  console.log(JSON.stringify({output: output.dims.map(Number), lengths: Array.from(size.data)}));
}

main().catch((e) => { console.error(String((e && e.message) || e)); process.exit(1); });
