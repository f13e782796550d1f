// A Node worker runs each session in a worker process of its own by default
// (core's rules, as for the Python worker): one controller's JavaScript never
// shares an event loop with another's, and a session's process ends with the
// session. Real processes on 127.0.0.1.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const c = require('..')
const { startWorker, tokenFile } = require('./helpers.js')

/** True once process `pid` has exited (a zombie not yet reaped counts). */
function gone(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1')
    return (
      stat
        .slice(stat.lastIndexOf(')') + 1)
        .trim()
        .split(/\s+/)[0] === 'Z'
    )
  } catch {
    return true
  }
}

/** The parent of live process `pid`. */
function parent(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1')
  return Number(
    stat
      .slice(stat.lastIndexOf(')') + 1)
      .trim()
      .split(/\s+/)[1],
  )
}

async function eventually(what, patience, done) {
  const deadline = Date.now() + patience
  while (!done()) {
    if (Date.now() > deadline) assert.fail(`${what} within ${patience} ms`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

/** The id of the process that runs `client`'s session's JavaScript. */
async function sessionPid(client) {
  const x = c.devicePut(new Int32Array([0]), client.devices()[0])
  const pid = c
    .colocated((v) => colocated.devicePut(new Int32Array([process.pid]), v.sharding))
    .specialize({ outSpecsFn: (v) => v })
  const [value] = await (await pid(x)).toTypedArray()
  return value
}

test('two controllers’ sessions on a Node worker run in processes of their own that end with them', async () => {
  const token = tokenFile()
  const worker = await startWorker({ devices: 1, token, node: true, isolated: true })
  try {
    const connect = () => c.connect(worker.address, { tokenFile: token.file, default: false })
    const [a, b] = [await connect(), await connect()]
    const [pidA, pidB] = [await sessionPid(a), await sessionPid(b)]
    assert.notEqual(pidA, pidB)
    for (const pid of [pidA, pidB]) {
      assert.notEqual(pid, worker.pid)
      assert.notEqual(pid, process.pid)
      assert.equal(parent(pid), worker.pid, 'a session worker of the supervisor')
      assert.match(fs.readFileSync(`/proc/${pid}/cmdline`, 'latin1'), /colocated\.js\0worker\0/)
    }
    assert.equal(await sessionPid(a), pidA)
    // A closed session's process exits; the other serves on.
    a.close()
    await eventually('the closed session’s worker exits', 5000, () => gone(pidA))
    assert.ok(!gone(pidB))
    assert.equal(await sessionPid(b), pidB)
    // A supervisor killed outright takes its session workers along (their
    // stdin, which it held, closes).
    await worker.kill('SIGKILL')
    await eventually('the session worker of a killed supervisor exits', 5000, () => gone(pidB))
    b.close()
  } finally {
    await worker.stop()
  }
})

test('a Node worker given --shared-sessions serves every session in its own process', async () => {
  const token = tokenFile()
  const worker = await startWorker({ devices: 1, token, node: true })
  try {
    const connect = () => c.connect(worker.address, { tokenFile: token.file, default: false })
    const [a, b] = [await connect(), await connect()]
    assert.equal(await sessionPid(a), worker.pid)
    assert.equal(await sessionPid(b), worker.pid)
    a.close()
    b.close()
  } finally {
    await worker.stop()
  }
})
