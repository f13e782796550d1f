// A devicePut to a worker costs the event loop one copy of its data; the
// transfer runs on the runtime's threads.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const c = require('..')
const { startWorker, tokenFile } = require('./helpers.js')

/**
 * Milliseconds the event loop's thread has waited for a CPU while it could
 * run, where Linux tells it (a loaded machine's), else 0.
 */
function runDelayMs() {
  try {
    return Number(fs.readFileSync(`/proc/self/task/${process.pid}/schedstat`, 'utf8').split(' ')[1]) / 1e6
  } catch {
    return 0
  }
}

/**
 * Calls `f` while a 10 ms interval timer watches the event loop: what it
 * returned, how long the call took (`wall`) and how long it ran (`busy`:
 * less its waits for a CPU), and the longest gap between the timer's ticks.
 */
async function watched(f) {
  let last = performance.now()
  let stall = 0
  const timer = setInterval(() => {
    const now = performance.now()
    stall = Math.max(stall, now - last)
    last = now
  }, 10)
  const pause = () => new Promise((resolve) => setTimeout(resolve, 30))
  await pause()
  const [delay, start] = [runDelayMs(), performance.now()]
  const value = f()
  const wall = performance.now() - start
  const waited = runDelayMs() - delay
  const busy = wall - waited
  await pause()
  clearInterval(timer)
  return { value, wall, busy, waited, stall }
}

const describe = (m) =>
  `${m.busy.toFixed(1)} ms busy (call ${m.wall.toFixed(1)} ms, longest stall ${m.stall.toFixed(1)} ms)`

test('a 64 MiB devicePut to a worker costs the event loop one copy of its data', async () => {
  const token = tokenFile()
  const worker = await startWorker({ devices: 1, token })
  const client = await c.connect(worker.address, { tokenFile: token.file, default: false })
  try {
    const device = client.devices()[0]
    const data = new Float32Array(16 << 20)
    const last = data.length - 1
    const bytes = new Uint8Array(data.buffer)
    // The baseline: copying the same bytes into memory written before.
    const target = new Uint8Array(bytes.length).fill(1)
    const copies = []
    for (let round = 0; round < 5; round++) copies.push(await watched(() => target.set(bytes)))
    // The first put of a size copies into fresh memory; later ones into the
    // memory a sent put leaves.
    const first = c.devicePut(data, device)
    await first.ready()
    first.delete()
    const puts = []
    for (let round = 1; round <= 3; round++) {
      data[last] = round
      const put = await watched(() => c.devicePut(data, device))
      // Changing the data after the call does not change what travels.
      data[last] = -1
      await put.value.ready()
      puts.push(put)
      if (round === 3) assert.equal((await put.value.toTypedArray())[last], 3)
      put.value.delete()
    }
    const median = (ms) => ms.slice().sort((a, b) => a.busy - b.busy)[ms.length >> 1]
    const [put, copy] = [median(puts), median(copies)]
    // Generous: one copy and the call's own work (before, the data was
    // copied twice, the first time into fresh memory).
    assert.ok(
      put.busy < 1.5 * copy.busy + 1,
      `devicePut: ${describe(put)}; copying the data: ${describe(copy)} (medians)`,
    )
  } finally {
    client.close()
    await worker.stop()
  }
})
