// One call of Ollama's JavaScript client, as an app makes it: node call.mjs HOST CALL MODEL PROMPT NUM_PREDICT
import { Ollama } from "ollama";

const [host, call, model, prompt, numPredict] = process.argv.slice(2);
const client = new Ollama({ host });
const options = { num_predict: Number(numPredict) };

if (call === "generate-stream") {
  let n = 0;
  for await (const part of await client.generate({ model, prompt, stream: true, options })) {
    if (part.response) n += 1;
  }
  console.log(JSON.stringify({ chunks: n }));
} else if (call === "chat") {
  const reply = await client.chat({ model, messages: [{ role: "user", content: prompt }], options });
  console.log(JSON.stringify({ eval_count: reply.eval_count }));
} else if (call === "embed") {
  const reply = await client.embed({ model, input: [prompt, prompt + " again"] });
  console.log(JSON.stringify({ vectors: reply.embeddings.length }));
} else {
  throw new Error(`unknown call ${call}`);
}
