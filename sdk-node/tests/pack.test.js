// `npm pack` of this package gives a tarball that installs (offline: the
// package has no runtime dependencies) and runs: the addon loads, arrays
// round-trip, and the `colocated` command is installed.

const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const PACKAGE = path.join(__dirname, '..')

test('npm pack gives a package that installs and runs from the tarball', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'colocated-pack-'))
  try {
    const npm = (args, cwd) => execFileSync('npm', [...args, '--no-audit', '--no-fund'], { cwd, encoding: 'utf8' })
    const [packed] = JSON.parse(npm(['pack', '--json', '--pack-destination', dir], PACKAGE))
    const files = packed.files.map((f) => f.path)
    for (const needed of [
      'index.js',
      'index.mjs',
      'index.d.ts',
      'binding.js',
      'colocated.js',
      'trees.js',
      'bin/colocated.js',
      'package.json',
    ]) {
      assert.ok(files.includes(needed), `${needed} is in the package`)
    }
    const addon = packed.files.find((f) => f.path.endsWith('.node'))
    assert.ok(addon, 'the addon is in the package')
    // `npm pack` builds the release addon first (its `prepack`): about 9 MB,
    // where a debug build is over 100 MB.
    assert.ok(addon.size < 32 * 1024 * 1024, `the packed addon is a release build (${addon.size} bytes)`)
    assert.ok(!files.some((f) => f.startsWith('tests/') || f.startsWith('src/') || f.startsWith('node_modules/')))
    const app = path.join(dir, 'app')
    fs.mkdirSync(app)
    fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', private: true }))
    npm(['install', '--offline', path.join(dir, packed.filename)], app)
    const script = `
      const c = require('colocated')
      c.configure({ numCpuDevices: 2 })
      const x = c.devicePut(new Int32Array([1, 2, 3, 4]), new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('x')))
      x.toTypedArray().then((back) => console.log(Array.from(back).join(',')))
    `
    const out = execFileSync(process.execPath, ['-e', script], { cwd: app, encoding: 'utf8' })
    assert.equal(out.trim(), '1,2,3,4')
    const esm = execFileSync(
      process.execPath,
      ['--input-type=module', '-e', "import { devices } from 'colocated'; console.log(devices().length > 0)"],
      { cwd: app, encoding: 'utf8' },
    )
    assert.equal(esm.trim(), 'true')
    const help = execFileSync(path.join(app, 'node_modules', '.bin', 'colocated'), ['status', '--help'], {
      encoding: 'utf8',
    })
    assert.match(help, /colocated status/)
  } finally {
    fs.rmSync(dir, { recursive: true, force: true })
  }
})
