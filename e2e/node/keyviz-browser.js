// The Key Visualizer's page in a real browser (e2e/test_keyviz_local.py): Debian's Chromium,
// headless, driven by playwright-core. Usage: node keyviz-browser.js <page url> <screenshot.png>
//
// Loads the page, waits until it says it rendered (body[data-state=ready]), reads the canvas's
// pixels, hovers the busiest cell of the hottest range, reads the tooltip, keeps a
// screenshot, and prints one JSON line of what it saw (the test asserts on it): console errors
// and page errors, the canvas's size and lit pixels, the tooltip's text, the hottest table's rows.
"use strict";
const { chromium } = require("playwright-core");

async function main() {
  const [url, shot] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  const out = { consoleErrors: [] };
  try {
    const page = await browser.newPage({
      viewport: { width: 1400, height: 1000 },
      deviceScaleFactor: Number(process.env.KEYVIZ_DPR || 1),
    });
    page.on("console", (m) => { if (m.type() === "error") out.consoleErrors.push(m.text()); });
    page.on("pageerror", (e) => out.consoleErrors.push(String(e)));
    await page.goto(url);
    try {
      await page.waitForSelector('body[data-state="ready"]', { timeout: 60000 });
    } catch (e) {
      out.status = await page.textContent("#status");
      out.state = await page.evaluate(() => document.body.dataset.state || "");
      console.log(JSON.stringify(out));
      process.exitCode = 2;
      return;
    }
    out.status = await page.textContent("#status");
    out.canvas = await page.evaluate(() => {
      const c = document.getElementById("heatmap");
      const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      // Lit: brighter than black (nothing counted) and than the page's no-samples grey.
      let lit = 0;
      for (let i = 0; i < px.length; i += 4) if (Math.max(px[i], px[i + 1], px[i + 2]) > 48) lit++;
      return { width: c.clientWidth, height: c.clientHeight, litPixels: lit,
               deviceWidth: c.width, deviceHeight: c.height };
    });
    // The busiest cell of the hottest range (its buckets: those starting in it; hex keys of
    // one case compare as the bytes do).
    const target = await page.evaluate(() => {
      const d = window.keyviz.data;
      const h = d.hottest[0];
      const inside = (x) => h && x.start_hex >= h.start_hex && (h.end_hex === "" || x.start_hex < h.end_hex);
      let best = null;
      for (let t = 0; t < d.times.length; t++) {
        for (let b = 0; b < d.buckets.length; b++) {
          if (h && !inside(d.buckets[b])) continue;
          if (!best || d.values[t][b] > d.values[best.t][best.b]) best = { t, b };
        }
      }
      const p = window.keyviz.cellCenter(best.t, best.b);
      const r = document.getElementById("heatmap").getBoundingClientRect();
      return { x: r.left + p.x, y: r.top + p.y, t: best.t, b: best.b };
    });
    await page.mouse.move(target.x, target.y);
    await page.waitForSelector("#tooltip", { state: "visible", timeout: 5000 });
    out.tooltip = await page.evaluate(() => {
      const el = document.getElementById("tooltip");
      return { text: el.innerText, bucket: Number(el.dataset.bucket), time: Number(el.dataset.time) };
    });
    out.target = { bucket: target.b, time: target.t };
    out.hottest = await page.$$eval("#hottest tbody tr", (rows) => rows.map((r) => r.innerText));
    out.buckets = await page.evaluate(() => window.keyviz.data.buckets.length);
    out.times = await page.evaluate(() => window.keyviz.data.times.length);
    await page.screenshot({ path: shot, fullPage: true });
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
