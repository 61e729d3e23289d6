"""Generate ``train_prompts.json``: the prompts used to self-distill drafters.

The draft model, early-exit adapter, Medusa heads and EAGLE head are trained on the target
model's own answers to these prompts (self-distillation). They cover the same seven workload
categories as the benchmark (``workloads.json``) but are written separately for this project and
share no text with it (``tests/measure/test_workloads.py`` checks: no shared 12-word window), so a
drafter is never scored on prompts it was trained on.

Every passage, code snippet, question, word problem and instruction template below is original
text written for this course. Prompts are composed from these pieces with a seeded RNG, so the
output is deterministic:

    python specdecode_ref/data/make_train_prompts.py          # rewrites data/train_prompts.json
    python specdecode_ref/data/make_train_prompts.py --check  # exit 1 if the file is stale

Categories (about 100 prompts each, ids ``train-<category>-NNN``):

* multi_turn: earlier user/assistant turns, ending with a user turn (3 or 5 messages).
* code: snippets (Python / JavaScript / SQL) to edit, fix, explain or test, plus from-scratch tasks.
* summarization: original passages (news, science, stories, notes, reviews) + a summary instruction.
* rag_qa: ``[Doc n]`` documents + a question to be answered from them with quotes.
* qa: open factual / explanatory questions.
* math: word problems and exercises with seeded numbers.
* rewrite: messy or informal texts to correct, formalise, simplify, restructure or translate.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT_PATH = Path(__file__).resolve().parent / "train_prompts.json"
SEED = 20240611
PER_CATEGORY = 100
CATEGORIES = ("multi_turn", "code", "summarization", "rag_qa", "qa", "math", "rewrite")


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


# ---------------------------------------------------------------------------------------------
# qa: open questions (no input to copy from)
# ---------------------------------------------------------------------------------------------

QA_QUESTIONS = [
    "Why does ice float on water when most solids sink in their own liquid?",
    "How does a microwave oven heat food, and why do some parts stay cold?",
    "What is the difference between weather and climate?",
    "Why do onions make people cry when they are cut?",
    "How do vaccines train the immune system?",
    "What is inflation, and why do central banks try to keep it around two percent?",
    "Why do cats purr? Is it always a sign that they are happy?",
    "How does GPS work out where my phone is?",
    "What is the difference between an alligator and a crocodile?",
    "Why do we get hiccups, and is there any proven way to stop them?",
    "How are tides caused, and why are there usually two high tides a day?",
    "What did the Rosetta Stone help scholars do?",
    "Explain in plain words what a black hole is.",
    "Why does bread go stale, and why does toasting it help?",
    "How do noise-cancelling headphones remove sound?",
    "What is the difference between a compiled and an interpreted programming language?",
    "Why are flamingos pink?",
    "What causes thunder, and why do we see lightning before we hear it?",
    "How does compound interest work? Give a small example.",
    "What is photosynthesis, in two or three sentences?",
    "Why do some people need glasses to see far away while others need them for reading?",
    "What was the Silk Road, and what was traded along it?",
    "How do bees make honey?",
    "Why is the ocean salty but rivers are not?",
    "What is the difference between speed and velocity?",
    "How does a solar panel turn sunlight into electricity?",
    "Why do we dream? What do scientists currently think?",
    "What makes a rainbow appear, and why is it curved?",
    "What is the Pythagorean theorem used for in everyday life?",
    "How do earthquakes happen, and why are some regions hit more often?",
    "What is a blockchain, explained for someone who is not technical?",
    "Why do leaves of some houseplants turn brown at the tips?",
    "How did the ancient Egyptians build the pyramids, as far as historians know?",
    "What is the difference between a hurricane, a typhoon and a cyclone?",
    "Why does metal feel colder than wood at the same room temperature?",
    "How does the heart pump blood around the body?",
    "What are prime numbers, and why are they important for online security?",
    "Why do volcanoes erupt?",
    "What is the greenhouse effect, and how is it different from global warming?",
    "How do birds know where to go when they migrate?",
    "What is a recession, and how do economists decide that one has started?",
    "Why do we have different blood types?",
    "How does a bicycle stay upright while it is moving?",
    "What is the difference between RAM and storage in a computer?",
    "Why do coffee and tea keep people awake?",
    "What was the purpose of the Great Wall of China?",
    "How are diamonds formed, and why are lab-grown diamonds cheaper?",
    "What does DNA do in a living cell?",
    "Why does the Moon show phases?",
    "How does a credit score work, and what raises or lowers it?",
    "What is the difference between an ocean and a sea?",
    "Why do our ears pop on a plane or when driving up a mountain?",
    "How does a dishwasher get dishes clean without scrubbing?",
    "What is an allergy, and why do some people develop them as adults?",
    "Who invented the printing telegraph, and how did Morse code work?",
    "What is the water cycle? Describe each stage briefly.",
    "Why are some people left-handed?",
    "How does a nuclear power plant generate electricity?",
    "What is the difference between a democracy and a republic?",
    "Why does popcorn pop?",
    "How does a touchscreen know where my finger is?",
    "What is a calorie, and how is it measured in food?",
    "Why do stars twinkle but planets mostly do not?",
    "What are the main differences between mammals and reptiles?",
    "How does soap remove grease from hands and dishes?",
    "What is the placebo effect, and why do drug trials need to account for it?",
    "Why do we yawn, and why is yawning contagious?",
    "How do glaciers move?",
    "What is the difference between a patent, a trademark and a copyright?",
    "Why does a spoon look bent in a glass of water?",
    "What was the Industrial Revolution, and why did it start in Britain?",
    "How does an electric car's battery get charged, and why does fast charging slow down near full?",
    "What is a supernova?",
    "How do plants know which way is up?",
    "Why do some foods, like apples and avocados, turn brown after being cut?",
    "What does an operating system actually do?",
    "How does the stock market work, in simple terms?",
    "Why do we need to sleep? What happens if we don't get enough?",
    "What are antibiotics, and why don't they work against a cold?",
    "How do submarines dive and come back to the surface?",
    "What is the difference between a lake and a pond?",
    "Why does the Earth have a magnetic field, and what does it protect us from?",
    "How is glass made?",
    "What is machine learning, explained with an everyday example?",
    "Why do camels have humps, and what is stored in them?",
    "How did people tell time before mechanical clocks?",
    "What causes the northern lights?",
    "What is the difference between baking soda and baking powder?",
    "Why is it harder to breathe at high altitude?",
    "How does a lock and key work inside a typical front door lock?",
    "What is an ecosystem? Give an example and name a few of its parts.",
    "Why do we have time zones, and who decided where they go?",
    "How do octopuses change color?",
    "What is the difference between a star and a planet?",
    "Why do tires have treads?",
    "How does a thermostat keep a room at a steady temperature?",
    "What is the Doppler effect? Give an example from daily life.",
    "Why did the dinosaurs go extinct, according to most scientists?",
    "How does recycling plastic actually work, and why can't all plastic be recycled?",
    "What is the role of the liver in the human body?",
    "Why do some metals rust and others do not?",
    "How do fireworks get their different colors?",
    "What is a haiku, and what rules does it follow?",
    "Why do we see our breath on a cold morning?",
]

QA_SUFFIXES = ["", "", "", " Keep it short.", " Explain it like I'm 12.", " Please answer in a few paragraphs.",
               " Give me a short answer and then a more detailed one.", " Use a simple analogy if you can."]


# ---------------------------------------------------------------------------------------------
# math: word problems and exercises; each template draws its own numbers
# ---------------------------------------------------------------------------------------------

NAMES = ["Aisha", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Idris", "Jonas", "Keiko",
         "Leon", "Mira", "Nikhil", "Odette", "Pavel", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor",
         "Wen", "Ximena", "Yusuf", "Zara"]

MATH_SHOW = [" Show your work.", " Explain each step.", " Walk me through the solution.",
             " Please reason step by step and state the final answer clearly.", " Show the calculation.",
             " Give the answer and a short explanation.", ""]


def _m(rng: random.Random) -> str:
    return rng.choice(NAMES)


MATH_TEMPLATES = [
    lambda r: (f"{_m(r)} reads {r.randint(12, 40)} pages of a {r.choice([240, 320, 360, 480])}-page novel every "
               "evening. After how many evenings will the book be finished, and how many pages are read on the last evening?"),
    lambda r: (f"A water tank holds {r.choice([600, 750, 900, 1200])} liters. One pipe fills it at {r.randint(15, 30)} "
               f"liters per minute while a leak drains {r.randint(2, 8)} liters per minute. Starting empty, how long until it is full?"),
    lambda r: (f"Find two consecutive even numbers whose sum is {2 * r.randint(20, 90) + 2}."),
    lambda r: (f"A phone plan costs ${r.randint(8, 15)} per month plus ${r.choice([0.05, 0.10, 0.15])} per minute of calls. "
               f"{_m(r)}'s bill last month was ${r.randint(20, 45)}.{r.choice(['00', '50'])}. How many minutes did they talk?"),
    lambda r: (f"The ratio of red to blue beads in a jar is {r.randint(2, 5)}:{r.randint(6, 9)}. If there are "
               f"{r.choice([140, 165, 198, 220, 264])} beads in total, how many of each color are there? If the total does not divide evenly, say so."),
    lambda r: (f"Solve the system of equations: {r.randint(2, 5)}x + {r.randint(1, 4)}y = {r.randint(20, 40)} and "
               f"x - y = {r.randint(1, 6)}."),
    lambda r: (f"What is {r.randint(12, 35)}% of {r.choice([80, 150, 240, 360, 475, 1200])}? Then increase that result by "
               f"{r.randint(5, 20)}%."),
    lambda r: (f"A cyclist rides {r.randint(18, 42)} km uphill at {r.randint(10, 14)} km/h and comes back down the same road "
               f"at {r.randint(25, 40)} km/h. How long does the round trip take, and what is the average speed?"),
    lambda r: (f"A circle has a radius of {r.randint(3, 15)} cm. Find its circumference and area. Use pi = 3.14."),
    lambda r: (f"A box of {r.choice([6, 8, 12])} cupcakes costs ${r.randint(9, 18)}.{r.choice(['00', '50', '75'])}, and single "
               f"cupcakes cost ${r.choice(['1.80', '2.10', '2.40'])} each. {_m(r)} needs {r.randint(20, 40)} cupcakes. What is the cheapest way to buy them?"),
    lambda r: (f"Simplify the fraction {r.choice([18, 24, 36, 42, 60])}/{r.choice([48, 54, 72, 84, 90])} and write it as a decimal "
               "rounded to three places."),
    lambda r: (f"A shop sells a lamp for ${r.randint(45, 120)}, which gives it a {r.randint(20, 60)}% profit on its cost. "
               "What did the shop pay for the lamp?"),
    lambda r: (f"Factor the quadratic x^2 + {r.choice([5, 7, 9, 11, 13])}x + {r.choice([6, 10, 12, 18, 20, 24, 30])} if it "
               "can be factored over the integers; otherwise solve it with the quadratic formula."),
    lambda r: (f"{_m(r)} puts ${r.choice([500, 1000, 2500, 4000])} into a savings account that pays {r.choice([2, 3, 4, 5])}% "
               f"interest compounded once a year. How much is in the account after {r.randint(2, 6)} years?"),
    lambda r: (f"Three friends split a restaurant bill of ${r.randint(60, 140)}.{r.choice(['20', '45', '80'])}. They add a "
               f"{r.choice([10, 15, 18, 20])}% tip on the full bill. How much does each person pay, rounded to the cent?"),
    lambda r: (f"The angles of a triangle are x, {r.randint(2, 3)}x and x + {r.choice([10, 20, 30])} degrees. Find all three angles."),
    lambda r: (f"A rectangular swimming pool is {r.randint(10, 25)} m long, {r.randint(5, 12)} m wide and "
               f"{r.choice([1.2, 1.5, 1.8, 2])} m deep. How many liters of water does it hold when full?"),
    lambda r: (f"Convert {r.randint(3, 9)} hours {r.randint(5, 55)} minutes into minutes, and then into seconds."),
    lambda r: (f"Two bags contain marbles. Bag A has {r.randint(3, 7)} green and {r.randint(3, 7)} yellow marbles. "
               "If I pick one marble from Bag A at random, what is the probability that it is green? What if I pick two without replacement?"),
    lambda r: (f"What is the mean, median and mode of these numbers: "
               f"{', '.join(str(r.randint(2, 30)) for _ in range(r.randint(7, 10)))}?"),
    lambda r: (f"A car uses {r.choice([5.5, 6.2, 7.0, 8.4])} liters of fuel per 100 km. Fuel costs "
               f"{r.choice(['1.65', '1.79', '1.92'])} euros per liter. How much does a {r.randint(180, 650)} km trip cost?"),
    lambda r: (f"Write {r.randint(100, 999)} in binary, then check the answer by converting it back to decimal."),
    lambda r: (f"A painter can paint a fence in {r.randint(4, 8)} hours, and an assistant can paint it in {r.randint(6, 12)} "
               "hours. How long does it take if they work together?"),
    lambda r: (f"Expand and simplify: ({r.randint(2, 5)}x + {r.randint(1, 9)})(x - {r.randint(1, 9)})."),
    lambda r: (f"A school has {r.randint(320, 880)} students. {r.randint(35, 65)}% of them take the bus, and a quarter of the "
               "rest walk. The others are driven. How many students are driven to school?"),
    lambda r: (f"Find the least common multiple and the greatest common divisor of {r.choice([12, 18, 24, 28])} and "
               f"{r.choice([30, 42, 45, 63])}."),
    lambda r: (f"A ladder {r.choice([5, 6.5, 10, 13])} m long leans against a wall. Its foot is {r.choice([1.5, 2, 2.5, 3])} m "
               "from the wall. How high up the wall does it reach?"),
    lambda r: (f"{_m(r)} is {r.randint(3, 6)} times as old as their daughter. In {r.randint(8, 14)} years, they will be twice "
               "as old as she is then. How old are they now? If the numbers do not work out to whole years, explain why."),
    lambda r: (f"A recipe needs {r.choice(['3/4', '2/3', '1 1/2'])} cup of sugar per batch. How much sugar is needed for "
               f"{r.randint(3, 7)} batches? Give the answer as a mixed number."),
    lambda r: (f"The population of a town grows by {r.choice([2, 3, 4])}% a year. It is {r.randint(20, 80)},000 today. "
               "Estimate the population in 10 years and explain the formula you used."),
    lambda r: (f"A store has a 'buy {r.randint(2, 3)}, get 1 free' deal on shirts that cost ${r.randint(14, 29)} each. "
               f"How much do {r.randint(7, 11)} shirts cost, and what is the effective price per shirt?"),
    lambda r: (f"Evaluate {r.randint(2, 9)} + {r.randint(2, 9)} x ({r.randint(10, 20)} - {r.randint(1, 9)}) / "
               f"{r.choice([2, 4, 5])} - {r.randint(1, 5)}^2 using the correct order of operations."),
    lambda r: (f"A map has a scale of 1:{r.choice([25000, 50000, 200000])}. Two villages are {r.choice([3.5, 6, 8.2, 12])} cm "
               "apart on the map. What is the real distance in kilometers?"),
    lambda r: (f"A worker earns ${r.randint(16, 32)} per hour for the first 40 hours a week and time-and-a-half after that. "
               f"How much do they earn in a week with {r.randint(42, 55)} hours?"),
    lambda r: (f"Find the slope and y-intercept of the line through the points ({r.randint(-5, 2)}, {r.randint(-4, 6)}) and "
               f"({r.randint(3, 9)}, {r.randint(-3, 12)}), and write its equation."),
    lambda r: (f"A cube has a surface area of {r.choice([54, 96, 150, 216, 294])} square centimeters. What is its volume?"),
    lambda r: (f"Roll two fair six-sided dice. What is the probability that the sum is {r.randint(5, 10)}? List the outcomes."),
    lambda r: (f"{_m(r)} runs {r.randint(3, 8)} laps of a {r.choice([400, 250, 800])} m track in {r.randint(14, 38)} minutes. "
               "What is their average pace in minutes per kilometer?"),
    lambda r: (f"Solve the inequality {r.randint(2, 7)}x - {r.randint(1, 12)} > {r.randint(10, 30)} and describe the solution set."),
    lambda r: (f"A farmer has {r.randint(30, 90)} animals, some chickens and some goats, with {r.randint(140, 260) // 2 * 2} legs in "
               "total. How many of each animal are there? If no whole-number answer exists, explain why."),
    lambda r: (f"Round {r.randint(1000, 9999)}.{r.randint(100, 999)} to the nearest ten, the nearest whole number and two "
               "decimal places."),
    lambda r: (f"The sum of an arithmetic sequence's first {r.randint(8, 20)} terms is wanted. The first term is {r.randint(2, 9)} "
               f"and each term increases by {r.randint(2, 7)}. Find the last term and the sum."),
]


# ---------------------------------------------------------------------------------------------
# code: snippets to work on (language, intro, code) and from-scratch tasks
# ---------------------------------------------------------------------------------------------

CODE_SNIPPETS = [
    ("python", "a helper from our grading script", '''def letter_grade(score):
    if score >= 90:
        return "A"
    elif score >= 80:
        return "B"
    elif score >= 70:
        return "C"
    elif score >= 60:
        return "D"
    return "F"


def class_report(scores):
    grades = {}
    for name, score in scores.items():
        grades[name] = letter_grade(score)
    average = sum(scores.values()) / len(scores)
    return grades, average'''),
    ("python", "a function that parses our config lines", '''def parse_config(text):
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=")
        settings[key.strip()] = value.strip()
    return settings'''),
    ("python", "a small bank account class", '''class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
        self.history.append(("withdraw", amount))'''),
    ("python", "code that finds duplicate files by size and name", '''import os


def find_duplicates(folder):
    seen = {}
    dupes = []
    for root, dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            key = (name, os.path.getsize(path))
            if key in seen:
                dupes.append((seen[key], path))
            else:
                seen[key] = path
    return dupes'''),
    ("python", "a moving average function that seems to give wrong results", '''def moving_average(values, window):
    result = []
    for i in range(len(values) - window):
        chunk = values[i:i + window]
        result.append(sum(chunk) / window)
    return result'''),
    ("python", "a retry helper for flaky network calls", '''import time


def retry(func, attempts=3, delay=1.0):
    for i in range(attempts):
        try:
            return func()
        except Exception as e:
            print("failed:", e)
            time.sleep(delay)
    return None'''),
    ("python", "a function that counts vowels and consonants", '''def count_letters(word):
    vowels = 0
    consonants = 0
    for ch in word.lower():
        if ch in "aeiou":
            vowels += 1
        elif ch.isalpha():
            consonants += 1
    return {"vowels": vowels, "consonants": consonants}'''),
    ("python", "a temperature conversion module", '''def c_to_f(c):
    return c * 9 / 5 + 32


def f_to_c(f):
    return (f - 32) * 5 / 9


def convert_all(readings, unit):
    out = []
    for r in readings:
        if unit == "C":
            out.append(c_to_f(r))
        else:
            out.append(f_to_c(r))
    return out'''),
    ("python", "a to-do list class", '''class TodoList:
    def __init__(self):
        self.items = []

    def add(self, text, priority=1):
        self.items.append({"text": text, "priority": priority, "done": False})

    def complete(self, text):
        for item in self.items:
            if item["text"] == text:
                item["done"] = True

    def pending(self):
        return [i["text"] for i in self.items if not i["done"]]'''),
    ("python", "a binary search that sometimes loops forever", '''def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        elif items[mid] < target:
            lo = mid
        else:
            hi = mid - 1
    return -1'''),
    ("python", "a script that summarizes a list of sales records", '''def summarize_sales(records):
    by_region = {}
    for rec in records:
        region = rec["region"]
        if region not in by_region:
            by_region[region] = {"count": 0, "revenue": 0.0}
        by_region[region]["count"] += 1
        by_region[region]["revenue"] += rec["units"] * rec["unit_price"]
    best = max(by_region, key=lambda r: by_region[r]["revenue"])
    return by_region, best'''),
    ("python", "a password strength checker", '''def check_password(pw):
    problems = []
    if len(pw) < 8:
        problems.append("too short")
    if not any(c.isdigit() for c in pw):
        problems.append("needs a digit")
    if not any(c.isupper() for c in pw):
        problems.append("needs an uppercase letter")
    if pw.lower() in ("password", "letmein", "qwerty123"):
        problems.append("too common")
    return len(problems) == 0, problems'''),
    ("python", "a function that chunks a list", '''def chunks(items, size):
    out = []
    current = []
    for item in items:
        current.append(item)
        if len(current) == size:
            out.append(current)
            current = []
    return out'''),
    ("javascript", "a JavaScript function from our front end", '''function formatPrice(cents, currency) {
  var amount = cents / 100;
  if (currency == "EUR") {
    return amount.toFixed(2) + " €";
  } else if (currency == "USD") {
    return "$" + amount.toFixed(2);
  }
  return amount.toFixed(2) + " " + currency;
}'''),
    ("javascript", "a debounce helper", '''function debounce(fn, wait) {
  let timer;
  return function (...args) {
    clearTimeout(timer);
    timer = setTimeout(() => fn.apply(this, args), wait);
  };
}

const onResize = debounce(() => console.log("resized"), 200);
window.addEventListener("resize", onResize);'''),
    ("javascript", "code that fetches a user's posts", '''async function loadPosts(userId) {
  const res = await fetch("/api/users/" + userId + "/posts");
  const data = await res.json();
  const titles = [];
  for (let i = 0; i < data.length; i++) {
    if (data[i].published) {
      titles.push(data[i].title);
    }
  }
  return titles;
}'''),
    ("javascript", "a shopping cart module", '''const cart = [];

function addToCart(product, qty) {
  const existing = cart.find(item => item.id === product.id);
  if (existing) {
    existing.qty + qty;
  } else {
    cart.push({ id: product.id, name: product.name, price: product.price, qty: qty });
  }
}

function cartTotal() {
  return cart.reduce((sum, item) => sum + item.price * item.qty, 0);
}'''),
    ("javascript", "a function that validates a sign-up form", '''function validateSignup(form) {
  const errors = {};
  if (!form.email || form.email.indexOf("@") === -1) {
    errors.email = "Please enter a valid email.";
  }
  if (!form.password || form.password.length < 8) {
    errors.password = "Password must be at least 8 characters.";
  }
  if (form.password !== form.confirm) {
    errors.confirm = "Passwords do not match.";
  }
  return errors;
}'''),
    ("javascript", "a function that groups events by day", '''function groupByDay(events) {
  const groups = {};
  events.forEach(e => {
    const day = new Date(e.timestamp).toISOString().slice(0, 10);
    if (!groups[day]) groups[day] = [];
    groups[day].push(e);
  });
  return groups;
}'''),
    ("sql", "a SQL query for our reporting dashboard", '''SELECT c.name, COUNT(o.id) AS orders, SUM(o.total) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
WHERE o.created_at >= '2023-01-01'
GROUP BY c.name
ORDER BY revenue DESC
LIMIT 10;'''),
    ("sql", "a query that should list employees earning more than their department's average", '''SELECT e.name, e.salary, e.department_id
FROM employees e
WHERE e.salary > (SELECT AVG(salary) FROM employees)
ORDER BY e.department_id, e.salary DESC;'''),
    ("sql", "the schema for a small library app", '''CREATE TABLE members (
    id INTEGER PRIMARY KEY,
    full_name TEXT NOT NULL,
    joined_on DATE NOT NULL
);

CREATE TABLE loans (
    id INTEGER PRIMARY KEY,
    member_id INTEGER REFERENCES members(id),
    book_title TEXT NOT NULL,
    borrowed_on DATE NOT NULL,
    returned_on DATE
);'''),
    ("sql", "a query that finds products that never sold", '''SELECT p.id, p.name
FROM products p
LEFT JOIN order_items oi ON oi.product_id = p.id
WHERE oi.product_id IS NULL
ORDER BY p.name;'''),
    ("python", "a class that caches expensive lookups", '''class LookupCache:
    def __init__(self, loader, max_size=100):
        self.loader = loader
        self.max_size = max_size
        self.data = {}

    def get(self, key):
        if key in self.data:
            return self.data[key]
        value = self.loader(key)
        if len(self.data) >= self.max_size:
            self.data.pop(next(iter(self.data)))
        self.data[key] = value
        return value'''),
    ("python", "a function that reads a CSV of students and returns the top scorers", '''import csv


def top_students(path, n=3):
    rows = []
    with open(path) as f:
        for row in csv.DictReader(f):
            rows.append((row["name"], int(row["score"])))
    rows.sort(key=lambda r: r[1])
    return rows[:n]'''),
    ("python", "a word-wrapping helper", '''def wrap(text, width):
    lines = []
    line = ""
    for word in text.split():
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = line + " " + word if line else word
    lines.append(line)
    return lines'''),
]

CODE_EDIT_TASKS = [
    "Add a docstring to every function or method and type hints where the language supports them. Keep the behavior the same and return the complete code.",
    "Is there a bug in this code? If so, explain what goes wrong, with an example input, and return a corrected version.",
    "Explain what this code does, line by line, for someone who is new to programming.",
    "Write unit tests for this code that cover the normal case and at least two edge cases.",
    "Refactor this code to be more readable and idiomatic without changing what it does. Return the full refactored version and list the changes.",
    "What happens with empty input or unusual values here? Add input validation with clear error messages and return the updated code.",
    "Review this code as if it were a pull request: point out problems, style issues and possible improvements, most important first.",
    "Add comments that explain the non-obvious parts, then show one example of calling it and the result.",
]
SQL_EDIT_TASKS = [
    "Explain what this SQL does, clause by clause.",
    "Is this SQL correct for what it is supposed to do? If not, fix it and explain the change.",
    "Rewrite this SQL so it is easier to read, using clear aliases and comments, and keep the same result.",
    "Suggest indexes that would make this faster and explain why each helps.",
]

CODE_SCRATCH = [
    "Write a Python function `roman_to_int(s: str) -> int` that converts a Roman numeral like 'MCMXCIV' into an integer. Include a few example calls.",
    "Write a Python function that checks whether two strings are anagrams of each other, ignoring spaces and letter case.",
    "Write a JavaScript function `countdown(seconds)` that logs the remaining seconds once per second and logs 'Done!' at the end.",
    "Write a SQL query that returns, for each month of 2023, the number of new users who signed up, using a table `users(id, created_at)`.",
    "Write a Python class `Stack` with push, pop, peek and is_empty methods, raising a clear error when popping from an empty stack.",
    "Write a Python function that takes a list of numbers and returns the second largest distinct value, or None if there isn't one.",
    "Write a Python script that reads a text file and prints the ten longest lines together with their line numbers.",
    "Write a JavaScript function that turns a string like 'hello world from js' into title case: 'Hello World From Js'.",
    "Write a Python function `run_length_encode(s)` that turns 'aaabccdddd' into 'a3b1c2d4', and a matching decode function.",
    "Write a Python generator that yields the Fibonacci numbers below a given limit, and show how to use it in a for loop.",
    "Write a SQL query that finds the three best-selling products in each category, given tables `products(id, name, category)` and `sales(product_id, quantity)`.",
    "Write a Python function that validates a date string in the format YYYY-MM-DD, including checking that the day exists in that month.",
    "Write a JavaScript function that removes duplicate objects from an array based on their `id` property, keeping the first one.",
    "Write a Python function that rotates a square matrix (a list of lists) 90 degrees clockwise.",
    "Write a Python function that converts a number of seconds into a readable string like '2 h 5 min 9 s'.",
    "Write a command-line Python program using argparse that takes a folder path and prints how many files of each extension it contains.",
    "Write a Python function `is_balanced(expr)` that checks whether the brackets (), [] and {} in a string are balanced.",
    "Write a JavaScript function that deep-clones a plain object containing nested objects and arrays without using structuredClone.",
    "Write a Python function that returns all the prime numbers up to n using the sieve of Eratosthenes, and explain its running time.",
    "Write a Python dataclass `Book` with title, author, year and isbn, plus a function that sorts a list of books by author and then year.",
    "Write a SQL statement that creates a table for blog comments with a foreign key to a posts table, and a query that counts comments per post.",
    "Write a Python function that finds the longest common prefix of a list of strings.",
    "Write a Python context manager that measures and prints how long the code inside the `with` block takes.",
    "Write a JavaScript function that checks whether a string is a valid IPv4 address.",
    "Write a Python function that merges overlapping intervals, e.g. [(1, 4), (3, 6), (8, 10)] becomes [(1, 6), (8, 10)].",
    "Write a Python function that counts how many times each character appears in a string and returns the result sorted by count.",
    "Write a Python function that converts a string in snake_case to camelCase and another that goes the other way.",
    "Write a small Python class `RateLimiter` that allows at most N calls per second and tells the caller how long to wait otherwise.",
    "Write a JavaScript function that returns the number of days between two dates given as 'YYYY-MM-DD' strings.",
    "Write a Python function that checks whether a 9x9 Sudoku grid (list of lists, 0 for empty) breaks any row, column or box rule.",
    "Explain the difference between a list and a tuple in Python, with short code examples showing when to use each.",
    "Explain what a closure is in JavaScript and give a small example where one is useful.",
    "Explain the difference between INNER JOIN and LEFT JOIN in SQL using two tiny example tables.",
    "Write a Python function that flattens a nested dictionary so {'a': {'b': 1, 'c': {'d': 2}}} becomes {'a.b': 1, 'a.c.d': 2}.",
    "Write a Python function `chunked_sum(numbers, k)` that returns the sums of consecutive groups of k numbers; the last group may be shorter.",
]


# ---------------------------------------------------------------------------------------------
# passages: used by summarization (summarise), rag_qa (answer from [Doc n]) and rewrite
# each: (kind, title, text, [questions answerable from the text])
# ---------------------------------------------------------------------------------------------

PASSAGES = [
    ("news article", "Harbor ferry", """The city of Westhaven will add an electric ferry to its harbor crossing next spring, the port authority announced on Wednesday. The vessel, named Tern, can carry 180 passengers and 40 bicycles and will replace one of the two diesel ferries that have run between the old town and the Kellsand peninsula since 1988.

The ferry cost 9.4 million euros, of which 60 percent came from a national clean transport fund. It will charge for seven minutes at each end of the crossing using new shore chargers, and the authority says the trip will take 14 minutes, the same as today.

Commuters welcomed the news but asked for later evening sailings. At present the last boat leaves the old town at 21:40. Port director Ines Varga said a timetable review would start in the autumn, and that the second diesel ferry would be replaced by 2028 if the first year goes well.""",
     ["How many passengers can the new ferry carry, and what does it replace?", "Who paid for the ferry?", "What did commuters ask for, and what was the response?"]),
    ("science explainer", "Why cats land on their feet", """Cats are famous for landing on their feet, and the trick starts in the inner ear. A part called the vestibular system tells the cat which way is up within a fraction of a second after it starts to fall.

The cat then twists its body in two halves. First it tucks its front legs in and rotates the front of its body while the back half turns only slightly. Then it does the reverse: it tucks the back legs and turns the rear. Because a cat has a very flexible spine and no fixed collarbone, it can do this without anything to push against.

Finally, the cat arches its back and spreads its legs, which slows the fall a little and spreads the impact. Surprisingly, vets have reported that cats falling from higher floors sometimes have fewer injuries than those falling from the second or third floor, possibly because they have more time to relax and get into position.""",
     ["Which part of the body tells a cat which way is up?", "Why can a cat twist in mid-air without pushing against anything?", "What surprising observation have vets reported?"]),
    ("short story", "The clockmaker's apprentice", """Every morning at six, Tomas unlocked the shutters of Mr. Albescu's clock shop and wound the forty-two clocks on the back wall, one after another, in the order the old man had taught him. He had done it for three years and had never been allowed to repair anything more complicated than a kitchen timer.

One rainy Thursday, a woman brought in a brass carriage clock that had belonged to her grandmother. It had stopped on the day of the funeral, she said, and nobody had been able to start it again. Mr. Albescu was away visiting his sister. Tomas told the woman to come back on Monday.

He spent the whole weekend on it. He found a hair-thin spring bent against the wheel and straightened it with tweezers and patience. When Mr. Albescu returned on Monday morning, the carriage clock was ticking on the counter. The old man listened to it for a long time, then handed Tomas a second key to the shop.""",
     ["What was Tomas allowed to repair before the story begins?", "What was wrong with the carriage clock?", "How does the story end?"]),
    ("company memo", "Office move", """To all staff: our Brennick Road office will move to the fourth floor of the Calloway Building at 12 Mercer Street. The move will happen over the weekend of October 12 and 13. Please pack your desk into the labelled crates, which will be delivered on Wednesday, October 9, and leave them by your desk by 5 p.m. on Friday, October 11.

IT will disconnect all desktop computers on Friday afternoon and set them up again in the new office. Laptops should be taken home for the weekend. Your access badge will be updated automatically; if it does not open the main door on Monday, go to reception on the ground floor.

The new office has 20 more desks, two quiet rooms and a larger kitchen. Parking is not available at Mercer Street, but the building is a five-minute walk from the Central bus station. Staff who drive can apply for a discounted monthly pass at the Northgate car park through the HR portal until October 4.""",
     ["When must crates be packed, and what should I do with my laptop?", "What happens if my badge does not work on Monday?", "Is there parking at the new office?"]),
    ("product review", "Slow cooker", """I bought the Hearthline 6-liter slow cooker after my old one cracked, and after two months of using it about twice a week, I have mixed feelings. The good: it is large enough for a whole chicken or a stew for eight people, the ceramic pot goes in the dishwasher, and the timer switches it to a keep-warm mode automatically, which has saved dinner more than once.

The less good: the low setting runs hotter than my old cooker, so recipes that used to take eight hours are done, and sometimes a bit dry, after six. The lid rattles when the contents boil, and the buttons are hard to read because the labels are printed in light grey on silver.

For the price, 59 dollars, it is still decent value. I would recommend it to families who cook big batches, but if you want precise control over temperature, look at a model with a probe. Three stars out of five.""",
     ["What size is the slow cooker, and what does the reviewer like about it?", "What problem does the low setting have?", "What rating does the reviewer give, and who do they recommend it to?"]),
    ("history article", "The Lindqvist canal", """The Lindqvist Canal, a 38-kilometer waterway linking the inland town of Ormberg to the sea at Salvik, was dug between 1821 and 1834. Before it opened, timber and iron from the Ormberg valley had to be carried by horse and cart over a hill road that was often impassable in spring mud.

The project was led by engineer Karin Lindqvist, one of very few women to direct a public works project in that period. She designed 11 locks to lift boats a total of 64 meters, and insisted on stone rather than wooden lock gates, which made the canal more expensive but allowed parts of it to remain in use for more than a century.

Railways took most of the freight traffic after 1890, and commercial use ended in 1951. Since 1986, volunteers have restored six of the locks, and the canal is now used by canoeists and tourist boats in summer. A small museum in the old lock keeper's house at Salvik tells the story of its construction.""",
     ["Who designed the canal and what choice made it last longer?", "Why was the canal built in the first place?", "How is the canal used today?"]),
    ("health guide", "Staying hydrated in hot weather", """In hot weather the body cools itself by sweating, and on a very warm day an adult can lose more than a liter of water an hour during exercise. Thirst is a useful signal, but it often lags behind, especially in older people, so it helps to drink regularly rather than waiting.

Water is the best choice for most people. Sports drinks can help during long, intense activity because they replace salt as well as fluid, but they contain a lot of sugar. Drinks with caffeine count toward daily fluid intake in moderate amounts, while alcohol makes the body lose more water than it provides.

A simple check is urine color: pale yellow generally means you are drinking enough, while dark yellow suggests you need more. Warning signs of heat exhaustion include dizziness, headache, heavy sweating and nausea. If they appear, move to a cool place, loosen clothing and sip water. Confusion or a very high body temperature are signs of heatstroke, which is an emergency.""",
     ["Why is thirst not always a good enough signal?", "What does the guide say about sports drinks and alcohol?", "What should someone do if they show signs of heat exhaustion?"]),
    ("news article", "Community orchard", """Residents of the Fairmead estate planted 64 fruit trees on Saturday on a strip of land that had been an empty lot for nearly twenty years. The community orchard, which includes apple, pear, plum and cherry trees, was organized by a group of neighbors who first met at a litter-picking day two years ago.

The land belongs to the county council, which agreed to a 25-year lease for a symbolic fee of one pound a year. A local garden center donated compost and wooden stakes, and pupils from Fairmead Primary School painted signs for each tree.

Organizer Dev Anand said the first fruit is expected in three to four years. The group plans to hold a harvest festival every September and has asked for volunteers to help with watering during the first two summers, when young trees are most at risk. A water tank has been installed, but the group is still raising money for a small tool shed.""",
     ["What kinds of trees were planted, and how many?", "On what terms is the land being used?", "What does the group still need?"]),
    ("science explainer", "How noise travels in cities", """Sound is a pressure wave, and in a city it behaves a lot like light in a room full of mirrors. Hard surfaces such as glass, concrete and asphalt reflect most of the sound that hits them, so noise from a busy road can bounce between buildings and reach windows that do not face the road at all.

Soft and uneven surfaces absorb or scatter sound instead. Grass, soil, trees and even rough brick walls reduce how much noise is reflected. That is why a street lined with trees often feels quieter, although a single row of trees does less than people expect; the effect is partly psychological, because greenery makes noise seem less annoying.

Engineers use several tools to reduce traffic noise: low-noise road surfaces with tiny pores that swallow sound, barriers beside motorways, and lower speed limits, since tire noise grows quickly with speed. Inside homes, sealed double-glazed windows are usually the most effective single measure.""",
     ["Why can road noise reach windows that do not face the road?", "Do trees really make streets quieter?", "What methods do engineers use to reduce traffic noise?"]),
    ("meeting notes", "School fair planning", """Parent council meeting, 3 March. Present: Lena (chair), Omar, Priti, Joachim, Sally.

1. Spring fair date confirmed for Saturday 18 May, 11:00 to 15:00, in the school playground, with the sports hall as backup if it rains.
2. Budget: last year's fair raised 2,340 pounds. This year's goal is 3,000, to pay for new library books and a reading corner.
3. Stalls: cake stall (Priti), second-hand books and toys (Omar), face painting (Sally to ask the art club). Joachim suggested a raffle; agreed, as long as prizes are donated.
4. Concern: last year the queue for food was too long. Decision: two food tables instead of one, and pre-made sandwiches.
5. Actions: Lena to book the hall as backup by 20 March; Joachim to contact local shops for raffle prizes; Omar to put a notice in the newsletter asking for donated books.
Next meeting: 7 April.""",
     ["When and where is the spring fair?", "What is the fundraising goal and what will the money pay for?", "Who is responsible for the raffle prizes?"]),
    ("travel guide", "Visiting the Velmar caves", """The Velmar caves, about 40 minutes by car from the town of Drosna, are a chain of limestone chambers that stretch for nearly three kilometers underground. Only the first 900 meters are open to visitors, on guided tours that leave every hour from 9:30 to 16:30 between April and October.

The temperature inside stays at about 11 degrees all year, so bring a warm layer even in summer. The path is lit and has handrails, but it includes 240 steps and can be slippery; the tour is not suitable for wheelchairs or pushchairs. Tours last 75 minutes and cost 14 euros for adults and 8 euros for children under 14.

The highlight is the Organ Hall, a chamber 30 meters high where dripping water has formed columns that look like organ pipes. Photography without flash is allowed. There is a café and a small exhibition about the bats that live in the closed sections of the cave.""",
     ["How much do tours cost and how long do they take?", "Can I take a pushchair into the caves?", "What is the Organ Hall?"]),
    ("opinion column", "The case for shorter meetings", """Most workplace meetings are scheduled for an hour for no better reason than that calendars offer one-hour slots by default. The result is predictable: discussion expands to fill the time, and people spend a large part of the week in rooms where they are neither deciding nor learning anything.

A few simple habits help. Make 25 or 50 minutes the default so people have time to move between meetings. Send a short agenda in advance and end the meeting as soon as the items are done. Invite only the people who need to decide; others can read the notes.

Critics say short meetings make it hard to build relationships, and that some problems need time to think aloud. That is fair, but those conversations are better held on purpose, in a relaxed setting, than squeezed into a status update. A meeting should be treated like any other cost: worth paying only when it buys something.""",
     ["What default meeting length does the author suggest?", "What objection to shorter meetings does the author mention, and how do they answer it?"]),
    ("nature article", "Hedgehogs in gardens", """Hedgehogs have declined sharply in much of the countryside, but many are now found in towns, where gardens offer insects, worms and safe places to nest. A hedgehog can travel up to two kilometers in a single night looking for food and a mate, which means it needs to move between many gardens.

Fences and walls are the biggest obstacle. Conservation groups recommend cutting a hole about 13 centimeters square at the bottom of garden fences, large enough for a hedgehog but too small for most pets. Whole streets have joined 'hedgehog highways' by linking their gardens this way.

Gardeners can also help by leaving a wild corner with leaves and logs, avoiding slug pellets, and checking compost heaps and long grass before using a fork or strimmer. Hedgehogs should never be given milk, which upsets their stomachs; a shallow dish of water and some meaty cat food is much better.""",
     ["How far can a hedgehog travel in a night?", "What size hole do conservation groups recommend?", "What should you feed a hedgehog, and what should you avoid?"]),
    ("press release", "Bakery opening", """Crumb & Co., the family bakery known for its rye sourdough, will open its third shop on 2 September at 41 Station Parade in Eastley. The new shop will have a seating area for 24 customers and will be the first Crumb & Co. location to serve hot breakfasts.

Founder Marta Kowalczyk started the business in 2015 from her home kitchen, selling loaves at a weekend market. The company now employs 38 people and bakes about 2,500 loaves a day at its central bakery. The Eastley shop will create 12 new jobs, and applications are open on the company website until 10 August.

To celebrate the opening, the first 100 customers on 2 September will receive a free loaf, and every coffee will cost one pound during the opening week. Opening hours will be 7:00 to 18:00 from Monday to Saturday and 8:00 to 14:00 on Sundays.""",
     ["Where and when does the new shop open?", "How did the company begin?", "What are the opening offers and hours?"]),
    ("technical note", "Backing up photos", """A good backup plan follows the 3-2-1 rule: keep three copies of your important files, on two different types of storage, with one copy in a different place. For family photos, that could mean the originals on your laptop, a copy on an external hard drive, and a copy in a cloud storage service.

External drives are cheap, but they fail eventually, and a drive kept next to the laptop can be lost in the same fire or burglary. Cloud storage protects against that, but it costs a monthly fee and depends on a good internet connection for the first upload, which can take days for a large library.

Whatever you choose, automate it. Backups that depend on remembering to copy files are usually out of date when you need them. Finally, test your backup once or twice a year by restoring a few files; a backup that cannot be restored is not a backup.""",
     ["What is the 3-2-1 rule?", "What are the downsides of an external drive and of cloud storage?", "Why should you test a backup?"]),
    ("biography", "Amelia Ross, mapmaker", """Amelia Ross was born in 1902 in a small mining town and learned to draw maps by copying the survey plans her father brought home from work. At nineteen she joined the national survey office as a typist, since women were not then accepted as surveyors, and spent her evenings redrawing field sketches that the men had handed in.

Her maps were so clear that, in 1928, the office quietly allowed her to lead a survey of the northern lake district. Over the next twenty years she mapped more than 4,000 square kilometers of forest and lakes, often travelling by canoe with two assistants.

Ross pioneered the use of aerial photographs to check ground measurements, a method that saved months of work. She retired in 1962 and wrote a popular book about her travels. A lake in the district she mapped was named after her in 1975, three years after her death.""",
     ["How did Amelia Ross first join the survey office?", "What method did she pioneer?", "How was she honored?"]),
    ("news article", "Library of things", """The town of Brackley Green has opened a 'library of things', where residents can borrow tools and household items instead of buying them. The collection, housed in a converted shipping container behind the community center, includes drills, ladders, a carpet cleaner, camping tents, a sewing machine and a projector.

Membership costs 20 pounds a year, or 5 pounds for people on benefits, and items are borrowed for up to a week. The project was funded by a 15,000-pound grant from a waste-reduction charity and is run by volunteers on Tuesday evenings and Saturday mornings.

Organizer Femi Adeyemi said a typical drill is used for only a few minutes in its whole life, and sharing such items saves money and reduces waste. In the first month, 112 people signed up and 230 items were borrowed. The most popular item so far is the carpet cleaner, which has a waiting list.""",
     ["What can people borrow and how much does membership cost?", "How was the project funded and who runs it?", "What was the most popular item in the first month?"]),
    ("science explainer", "How a sourdough starter works", """A sourdough starter is a mix of flour and water that has been taken over by wild yeasts and bacteria. These microbes arrive on the flour itself and from the air and the baker's hands. When the mixture is fed regularly with fresh flour and water, the hardiest microbes win and form a stable community.

The yeasts produce carbon dioxide gas, which makes bread rise. The bacteria, mostly kinds of lactobacilli, produce lactic and acetic acids. These acids give sourdough its tangy taste and make the environment too sour for most harmful microbes, which is why a healthy starter rarely spoils.

A new starter usually takes five to ten days to become reliable. At first it may bubble a lot and then go quiet for a day or two; this is normal, as early bacteria die off and the stable community takes over. Once established, a starter can be kept in the fridge and fed once a week.""",
     ["Where do the microbes in a starter come from?", "What do the yeasts and bacteria each produce?", "Why might a new starter go quiet after a few days?"]),
    ("policy document", "Volunteer drivers", """Volunteer Driver Scheme – Guidelines for Drivers. Volunteers use their own cars to take older or disabled residents to medical appointments, shops and social activities. Drivers must be aged 21 or over, have held a full licence for at least three years, and provide proof of insurance that covers voluntary driving.

Mileage is reimbursed at 45 pence per mile, counted from the driver's home. Parking fees at hospitals are also refunded if a receipt is provided. Claims must be submitted by the fifth day of the following month.

Drivers should not help passengers with medication or lift them in or out of the car. If a passenger seems unwell, the driver should call the scheme coordinator, or 999 in an emergency. Trips are booked at least two working days in advance through the coordinator; drivers should not arrange trips directly with passengers.""",
     ["What are the requirements to become a driver?", "How much is mileage reimbursed, and by when must claims be made?", "Can drivers arrange trips directly with passengers?"]),
    ("short story", "The last bus", """Priya missed the last bus by eleven seconds. She watched its red lights turn the corner, then sat down on the bench and checked her phone: four percent battery, and a message from her brother saying he was already asleep.

A man in a high-visibility jacket sat down at the other end of the bench. He was a street cleaner, he said, finishing his shift, and he walked home every night along the river path. It was forty minutes, but the path was lit and there were always people about. Priya hesitated, then asked if she could walk with him as far as the bridge.

They talked about his allotment, where he grew more courgettes than anyone could eat, and about her exams. At the bridge he pointed out her street and waved goodbye. A week later, Priya found a bag of courgettes hanging on her door handle with a note: 'For the exam brain.'""",
     ["Why did Priya end up walking home?", "Who was the man and what did they talk about?", "What happened a week later?"]),
    ("consumer advice", "Buying a used bicycle", """Before buying a second-hand bike, check that the frame is the right size: standing over the top tube, you should have a few centimeters of clearance. Look closely at the frame for cracks, especially near the joints, and avoid bikes with bent forks or deep rust.

Spin each wheel and watch for wobbles; a small wobble can be fixed, but a dented rim usually means a new wheel. Squeeze the brakes and push the bike forward; it should not move. Run through all the gears, listening for skipping or grinding, and check the chain for stretch with a ruler or an inexpensive chain checker.

Ask the seller how long they have had the bike and whether it has been serviced. A frame number can be checked against stolen-bike registers online, and it is worth doing before handing over money. Budget an extra 50 to 100 for new tires, brake pads or a service even on a bike that looks good.""",
     ["How can I check the frame size?", "How should the brakes be tested?", "What can I do to avoid buying a stolen bike?"]),
    ("news article", "Night trains return", """A new overnight train service between Halden and the mountain town of Brisa will start on 14 December, bringing back a route that was closed in 2009. Trains will leave Halden at 21:15 on Fridays and Sundays and arrive in Brisa at 7:05 the next morning.

Each train will have sleeping cars with two- and four-bed compartments, a car with reclining seats, and a small bistro. Fares start at 39 euros for a seat and 89 euros for a bed in a four-bed compartment. Bicycles and skis can be carried if booked in advance.

The operator, Nordlys Rail, said demand had grown as more travelers try to avoid short flights. The service is a two-year trial funded partly by the regions along the route. If at least 60 percent of beds are filled on average, the company plans to run the train four nights a week from 2027.""",
     ["When does the train leave and arrive?", "What kinds of accommodation and fares are offered?", "What would make the company expand the service?"]),
    ("science explainer", "How tree rings record the past", """Every year a tree in a temperate climate adds a new layer of wood under its bark. In spring it grows quickly and makes light, wide cells; in late summer growth slows and the cells become dark and dense. The result is a visible ring for each year.

Ring width depends on conditions. In a wet, warm year a tree usually grows a wide ring, while drought or a cold summer produces a narrow one. By matching patterns of wide and narrow rings between living trees, old beams and preserved wood, scientists have built continuous records going back thousands of years.

This method, called dendrochronology, can date a wooden building to the exact year its timber was cut. Rings also record events such as forest fires, which leave scars, and volcanic eruptions, which can cool the climate and cause unusually narrow rings across a whole region.""",
     ["Why does a tree form a visible ring each year?", "What does a narrow ring usually indicate?", "What else can tree rings reveal besides the age of wood?"]),
    ("customer email", "Delayed order", """Dear customer, thank you for your order of the Alder oak bookshelf (order 58213), placed on 2 June. We are sorry to tell you that the item is delayed because our supplier's workshop was closed for two weeks after a flood.

The bookshelf is now expected to be dispatched on 1 July and delivered within five working days after that. You do not need to do anything to keep your order. If you would prefer not to wait, you can cancel it from the 'My orders' page and receive a full refund within three working days.

As an apology, we have added a voucher worth 15 percent off your next order to your account; it is valid until the end of the year. If you have any questions, our customer service team can be reached by phone from 8:00 to 18:00 on weekdays or by replying to this email.""",
     ["Why is the order delayed and when will it arrive?", "How can the customer cancel and how quickly is the refund paid?", "What compensation is offered?"]),
    ("history article", "The Hollin bridge", """The Hollin bridge, a stone arch bridge across the river Vane, was built in 1612 by order of the town's wool merchants, who were tired of paying the ferryman's toll. It has five arches and is 74 meters long, and for more than two centuries it was the only crossing for twenty kilometers in either direction.

In 1771 a great flood destroyed the two central arches. Rather than rebuild them in stone right away, the town put up a wooden section, which lasted until 1803 when the arches were finally replaced. Careful observers can still see that the middle arches are made of a lighter stone than the others.

Motor traffic was banned from the bridge in 1968 after a new road bridge opened downstream. Today it is used only by pedestrians and cyclists, and the small chapel on its central pier, once used to collect tolls, is open to visitors on summer weekends.""",
     ["Why was the bridge built?", "What happened in 1771 and how can you still tell?", "How is the bridge used today?"]),
    ("product description", "Folding camping stove", """The Pika folding camping stove weighs 310 grams and packs into a case the size of a paperback book. It runs on standard screw-on gas canisters and boils one liter of water in about four minutes at sea level, although it takes longer in wind or cold.

Three fold-out arms support pots up to 22 centimeters across, and a built-in igniter means no matches are needed. The flame can be turned down low enough to simmer sauces or porridge. A foldable windshield is included, but it should never be placed so that it wraps around the gas canister, which could overheat.

The stove comes with a two-year warranty. It is not designed for indoor use or use inside a tent, where carbon monoxide can build up.""",
     ["How heavy is the stove and how fast does it boil water?", "What safety warnings are given?"]),
    ("local news", "Road closure", """Harwick Road between the Elm Street roundabout and the railway bridge will be closed to all traffic from 8 July for about six weeks while a collapsed water main is replaced. The water company said the pipe, laid in 1934, had burst three times in the past year.

Buses 12 and 12A will be diverted via Northfield Avenue, and two temporary stops will be set up outside the leisure center. Pedestrian access to shops on Harwick Road will be kept open at all times, and deliveries will be allowed before 9 a.m.

Some homes may have low water pressure for short periods, and residents will receive a letter at least 48 hours before any planned interruption. The council has apologized for the disruption and said the work was timed to coincide with the school summer holidays, when traffic is lighter.""",
     ["Why is the road being closed and for how long?", "What happens to the buses?", "Why was the timing chosen?"]),
    ("study guide", "The water cycle in three steps", """Water moves around the Earth in a continuous cycle powered by the Sun. First, heat causes water in oceans, lakes and rivers to evaporate, turning it into invisible water vapour. Plants also release water vapour through their leaves, a process called transpiration.

Second, as warm, moist air rises, it cools. Cool air cannot hold as much vapour, so the vapour condenses into tiny droplets around specks of dust, forming clouds. When these droplets join together and become too heavy, they fall as precipitation: rain, snow, sleet or hail.

Third, the water collects. Some runs over the land into rivers and back to the sea, some soaks into the ground and becomes groundwater, and some is stored for a long time as ice in glaciers. Eventually, all of it evaporates again and the cycle continues.""",
     ["What is transpiration?", "How do clouds form?", "Where does water go after it falls as precipitation?"]),
    ("announcement", "Pool reopening", """Southmoor Leisure Centre's main pool will reopen on Monday 4 November after a six-month refurbishment. The 25-meter pool has new tiles, a movable floor that allows the depth of one half to be changed for lessons, and a new filtration system that uses less chlorine.

Public swimming times will be 6:30 to 9:00 and 18:00 to 21:30 on weekdays, and 8:00 to 17:00 at weekends. Lane swimming will be available at all public sessions. Swimming lessons for children restart in the week of 11 November; parents who had booked places before the closure will be contacted by email.

To celebrate, swimming will be free for everyone during the first weekend. Prices from 11 November will be 5.20 for adults and 3.10 for children, with discounts for members. The smaller teaching pool remains closed until January for a separate repair.""",
     ["When does the pool reopen and what has changed?", "When are the public swimming times?", "Is the teaching pool open?"]),
    ("science explainer", "Why we get goosebumps", """Goosebumps appear when tiny muscles attached to the base of each hair contract. The muscles pull the hairs upright and push up a small bump of skin around each one. The reaction is controlled by the nervous system automatically; we cannot make it happen on purpose.

In furry animals, raised hair traps a thicker layer of air, which keeps the animal warmer, and it makes the animal look bigger to a threat, like a cat arching its back. Humans have lost most of their body hair, so goosebumps no longer do much to keep us warm, but the reflex has remained.

Goosebumps are triggered by cold, fear and strong emotions, including the thrill some people feel when listening to moving music. Recent research in mice also suggests that the same muscles help stimulate hair growth, which may be one reason the reflex has survived.""",
     ["What physically causes goosebumps?", "What use do goosebumps have for furry animals?", "What triggers goosebumps in humans?"]),
    ("email", "Neighbourhood clean-up", """Hi everyone, thank you to the 31 people who came to the Linden Park clean-up last Sunday. Together we filled 46 bags of rubbish, removed two old bicycles and a shopping trolley from the pond, and cleared the path by the playground of broken glass.

The council has agreed to install two more bins near the east gate, which was the worst area for litter, and will empty them twice a week in summer. They also promised to repair the broken light on the footpath by the end of the month.

Our next clean-up is on Sunday 9 June at 10:00, starting from the café. Gloves and litter pickers will be provided, but please bring water and wear sturdy shoes. Children are welcome if accompanied by an adult. If you can bring a wheelbarrow, please let me know by replying to this email. Best wishes, Agnes""",
     ["What did volunteers collect at the last clean-up?", "What has the council agreed to do?", "What should people bring to the next clean-up?"]),
    ("article", "Learning a language as an adult", """Adults often believe they are too old to learn a new language, but research suggests they have some advantages over children. Adults can learn grammar rules faster, use strategies such as flashcards, and make connections with languages they already know.

Where children do better is in pronunciation. People who start learning a language before adolescence are much more likely to sound like native speakers. Adults can still become fluent and easy to understand, but an accent usually remains.

The most reliable predictor of progress is not age but time spent actually using the language: listening, speaking, reading and writing. Short daily practice tends to work better than long weekly sessions, because memory is strengthened by repeated recall over time. Conversations with real people, even with mistakes, help more than perfect silence.""",
     ["What advantages do adults have when learning a language?", "In which area do children do better?", "What is the most reliable predictor of progress?"]),
    ("report", "Cycling survey results", """The city's annual cycling survey received 2,140 responses this year, up from 1,560 last year. Sixty-two percent of respondents said they cycle at least once a week, and the most common trip purposes were commuting (48 percent), shopping (21 percent) and leisure (19 percent).

Safety remained the biggest concern: 57 percent said traffic on main roads stops them cycling more often, and 34 percent mentioned a lack of secure parking, especially at the train station. Satisfaction with the new protected lane on Canal Street was high, with 81 percent rating it good or very good.

Based on the results, the transport department recommends extending the protected lane network to Market Road and Hill Street, and adding a 300-space bike shelter at the station. A public consultation on both projects will open in the spring.""",
     ["How many responses did the survey get, and how did that compare with last year?", "What were the main concerns?", "What does the department recommend?"]),
    ("short story", "The map in the attic", """When Lucia's grandmother moved into a care home, the family spent a weekend clearing her attic. Among boxes of old magazines, Lucia found a hand-drawn map of the village, with a small red cross in the woods behind the church and the words 'for L.' written underneath.

Her cousins laughed and said it was probably a childhood game. Lucia took it anyway. On Sunday morning she followed the map past the church, counted forty steps from the old stone wall, and found a flat rock half hidden by moss. Under it was a biscuit tin.

Inside were letters her grandmother had written to her grandfather during the year he worked abroad, before they were married, and a photograph of the two of them standing on that same rock. On the back was written: 'L. is for Leonora, and now for Lucia too.' Lucia brought the tin to the care home the next day, and her grandmother read every letter aloud.""",
     ["What did Lucia find in the attic?", "What was in the biscuit tin?", "What did the note on the photograph mean?"]),
    ("instructions", "Caring for a new houseplant", """When you bring a new houseplant home, keep it away from your other plants for two weeks to make sure it has no pests. Check under the leaves for tiny insects or sticky patches.

Most common houseplants prefer bright light without direct midday sun, which can scorch their leaves. Water only when the top two or three centimeters of soil feel dry; more plants die from too much water than too little. Make sure the pot has drainage holes and empty any water left in the saucer after half an hour.

Do not repot the plant straight away; moving house is stressful enough. Wait until spring, and then choose a pot only a few centimeters wider than the old one. Feed with a diluted liquid fertilizer once a month in spring and summer, and not at all in winter, when growth slows down.""",
     ["How long should a new plant be kept apart from others, and why?", "How do I know when to water?", "When should I repot and feed the plant?"]),
    ("news article", "Wildlife bridge", """A bridge built for animals over the A41 motorway near Stanhope Forest has been used more than 3,000 times in its first year, according to camera data released on Monday. The 40-meter-wide bridge, covered with soil, shrubs and young trees, was designed to reconnect two halves of the forest that were split when the road opened in 1979.

Cameras recorded deer, badgers, foxes, hares and, for the first time, a pine marten. Collisions between vehicles and deer on that stretch of road fell from 27 in the year before the bridge opened to 6 in its first year.

The project cost 7.8 million pounds. Critics said the money could have paid for many cheaper underpasses, but ecologists argue that larger animals such as deer rarely use tunnels. Two more wildlife bridges are being considered on other roads in the region.""",
     ["How often was the bridge used and which animals were seen?", "What happened to deer collisions?", "What criticism was made and how did ecologists respond?"]),
    ("guide", "Writing a good cover letter", """A cover letter should explain why you want this particular job and why you are a good fit, in less than one page. Start by naming the role and, if possible, how you heard about it. Avoid repeating your whole CV; instead, pick two or three achievements that match what the employer asks for in the job advert.

Be specific. 'I improved customer satisfaction' is weak; 'I reduced average response time from two days to four hours' is strong. If you are changing careers, explain briefly which skills transfer and why you are making the move.

End with a short, confident closing sentence and thank the reader for their time. Check names and spelling carefully: sending a letter addressed to the wrong company is one of the quickest ways to be rejected. If possible, ask someone else to read it before you send it.""",
     ["How long should a cover letter be?", "What does the guide say about being specific?", "What is one of the quickest ways to be rejected?"]),
    ("science explainer", "Why the sea glows at night", """On some summer nights, waves on the beach light up with a blue glow. This is bioluminescence, light produced by living things, and in coastal waters it usually comes from tiny single-celled organisms called dinoflagellates.

When the water around them is disturbed, for example by a wave, a swimmer or a boat, a chemical reaction inside the cells gives off a flash of light lasting a fraction of a second. Scientists think the flashes may startle predators or attract larger animals that eat the creatures feeding on the dinoflagellates.

The glow is easiest to see on dark, moonless nights, away from city lights, and after a period of warm, calm weather, when the organisms multiply. Some of the same species can cause harmful algal blooms, so local authorities sometimes advise against swimming during very large blooms.""",
     ["What organisms usually cause the glow?", "What triggers the flash of light?", "When is the glow easiest to see?"]),
    ("announcement", "Farmers market changes", """From 6 April, the Riverbank farmers market will move from Saturday to Sunday mornings and will run from 9:00 to 13:00. The change follows a survey in which 70 percent of stallholders said Sunday would bring more customers, as many shoppers visit the nearby park on Sunday mornings.

The market will also expand from 22 to 30 stalls, with new sellers offering cheese, mushrooms, honey and baked goods. All food sold must be grown, reared or made within 50 kilometers of the town.

Shoppers are encouraged to bring their own bags and containers; a refill station for washing-up liquid and oats will be trialled for three months. Parking in the riverside car park will be free until 13:30 on market days.""",
     ["When does the market run from April?", "Why was the day changed?", "What rule applies to food sold at the market?"]),
    ("interview summary", "Beekeeper profile", """Hamid Rahimi has kept bees for 26 years and now looks after 40 hives on farms around the village of Oakcombe. He started with a single hive that a neighbor gave him when he retired as a bus driver, and says the bees taught him patience.

He explains that a strong colony in summer can contain 50,000 bees, nearly all of them female workers. In a good year, each hive produces about 20 kilograms of honey that he can harvest while leaving enough for the bees to survive winter.

His biggest worry is the varroa mite, a parasite that weakens colonies, and the wet summers of recent years, which keep bees inside when they should be foraging. Hamid runs free beginner courses each spring and insists that new beekeepers spend a season helping an experienced keeper before buying their own hive.""",
     ["How did Hamid start beekeeping?", "How much honey does a hive produce in a good year?", "What are his main worries, and what advice does he give new beekeepers?"]),
    ("article", "The four-day school week debate", """Several rural school districts have moved to a four-day school week, usually with longer days from Monday to Thursday. Supporters say it saves money on buses and heating, makes it easier to recruit teachers, and gives families a day for appointments and activities.

Critics worry about children whose parents work on Fridays and cannot afford childcare, and about students who rely on school meals. Some districts offer optional Friday programs to address this, but not all can afford them.

Studies so far show mixed results. Some found small drops in test scores, especially in mathematics, while others found no clear difference. Savings are often smaller than expected, typically a few percent of the budget, because teacher salaries, the largest cost, do not change.""",
     ["What reasons do supporters give for the four-day week?", "What concerns do critics raise?", "What do studies show about the results and the savings?"]),
]


# ---------------------------------------------------------------------------------------------
# rewrite: informal / error-filled texts (kind, text) and instructions that keep their content
# ---------------------------------------------------------------------------------------------

MESSY_TEXTS = [
    ("message to a coworker", "hey Tomasz, sorry i missed the call this morning, my train was stuck outside the station for like 40 mins. can we move it to 3pm? i looked at the budget sheet and i think the numbers for march is wrong, the travel costs are counted twice. ill send you the corrected version before lunch. cheers, Ana"),
    ("email to a teacher", "Dear mrs Holloway, my son Felix wont be at school tomorow because he have a dentist appointment at 10:15 and than we need to go to his grandmas house. He will bring the science homework on wednesday, is that ok? Also he said theres a trip to the museum next week, we didnt get the form yet. thank you, Rebecca Lund"),
    ("note to a neighbour", "hi, its the people from number 14. we're having a small birthday party on saturday from 7 till about 11 so it might be a bit loud sorry in advance!! if its a problem just knock or text me on 07700 900123. you're also welcome to come by for cake lol. - Kim and Jo"),
    ("customer complaint", "I ordered the blue rain jacket size M on the 3rd and what arrived was a green one in size XL. this is the second time this happen with your shop. I already send an email on friday and nobody answered. I want either the right jacket by next week or my money back, I dont want a voucher. order number is 44-1907"),
    ("club announcement", "CHESS CLUB NEWS!!! we meet every tuesday now not thursday, same room (B12) from 4 to 6. beginners welcome, we have boards. also the tournament against Hillcrest is on 22nd of feb, we need 2 more players for the team so if your interested tell Mr Osei asap. bring snacks if u want"),
    ("message to a landlord", "hello, the kitchen tap have been dripping since about two weeks and now it is leaking under the sink also, the cupboard floor is wet. I put a bowl there. can someone come to fix it? I am at home monday and wednesday mornings. flat 7, Oak Court. thanks, Mehmet"),
    ("cover letter paragraph", "i am writing to apply for the job as a junior graphic designer what i saw on your website. i finished my degree in visual communication last year and since then i did freelance work for two local cafes and a bike shop, making there logos and menus. i am very good with illustrator and photoshop and i learn fast. i would love to bring my ideas to your team."),
    ("product feedback", "your app is ok but honestly the new update made it way worse. the button to add a expense is now hidden in a menu and it takes 3 taps instead of 1. also the dark mode doesn't work on the graphs page, its all white. i use this everyday for my small business so please fix this, i dont want to switch apps"),
    ("holiday message to a team", "hey team!! just a reminder the office is closed from the 23rd to the 2nd. if anything urgent comes up call Marco, he's on call the first week and me the second week. please make sure you set your out of office and save everything to the shared drive not your desktop. thanks for a crazy but great year, see you in january!!"),
    ("apology email", "hi Lars, im really sorry about yesterday, I totally forgot we had the meeting with the suppliers and I didnt send the updated price list. that was my mistake. I sent it now to you and to Greta. can we have a short call today to go through what they said? I'm free after 2. sorry again, Yuki"),
    ("school essay paragraph", "The Amazon rainforest are very important for the whole planet. It produce alot of oxygen and it is home for millions of species of animals and plants, many of them doesnt live anywhere else. But every year big parts of the forest is cut down for farming and wood. If this continue, many animals will dissapear and the climate will get more worse."),
    ("request to a manager", "hi Sandra, can I take friday the 14th off? my sister is getting married on saturday and I need to travel to Leeds on friday morning. I already finished the report for the quarterly review and Paul said he can cover the phones. let me know if thats fine, thanks! Joe"),
    ("review of a restaurant", "went here for my moms birthday. the food was really good specially the mushroom risotto and the lemon tart, but we waited almost an hour for the main course and nobody said sorry. the waiter was nice tho. its a bit expensive for what u get. maybe 3.5 out of 5, would go again but not on a busy night"),
    ("message to a tutor", "hi sorry i didnt do the exercises from last week, i had 3 exams. can we do the past tense again in our lesson thursday because i still dont get when to use which one. also can we start 15 min later? my bus is always late. see you, Olga"),
    ("notice to residents", "ATTENTION: the lift in block C will be out of order from monday 9am untill wednesday evening for repair. residents who need help with shopping or stairs can call the caretaker Dave on the number on the board. sorry for the inconvinience. the bins will also be collected tuesday instead of monday this week"),
    ("message to a sports coach", "hi coach, Maya hurt her ankle at the weekend, the doctor says its only a sprain but she shouldnt run for 2 weeks. can she still come to training and help with the younger kids or do stretching? she really dont want to miss the team. also we paid the fee for spring already. thanks, Daniel (Maya's dad)"),
    ("feedback on a draft", "ok i read your draft. overall its good but the intro is too long, you can cut the first paragraph totally. in section 2 the numbers from the survey should be in a table, its hard to follow in text. and the conclusion says something different than the summary at the start?? fix that. otherwise nice work, send me the new version by thursday"),
    ("text from a friend", "omg so the concert got moved to the 12th because the singer is sick, tickets are still valid. i can still drive us but i have to leave work at 5 so we'd get there around 7. doors open at 6:30 so its fine. can you bring the tickets? they're in your email i think. also should we eat before or get something there"),
    ("meeting follow-up", "thanks all for the meeting today. summary: we agreed to push the website launch to may 2 because the payment page isnt tested yet. Ravi will finish the testing by april 25. Lotte does the new photos. budget stays the same. next check-in is monday 10am, same link. pls tell me if i missed anything"),
    ("message to a plumber", "Hello, we need someone to look at our boiler, it makes a loud banging noise when the heating comes on and the water is only warm not hot. its a gas boiler maybe 12 years old. we live at 27 Fern Lane. is it possible this week? we can be home any afternoon. how much does a visit cost? Thanks, Sunita"),
    ("volunteer sign-up post", "we need volunteers for the food bank this saturday!! shifts are 9-12 and 12-3. jobs: sorting donations, packing boxes, and helping people carry stuff to their cars. no experience needed, just wear comfy shoes. under 16s need to come with a parent. reply here with which shift u want. thank uuu"),
    ("internal bug report", "the export button on the reports page dont work for some users. when they click it nothing happens, no file no error. i tested with chrome and it works, with firefox it dont. happened since the release on tuesday. two customers complained already, one is a big account so its kind of urgent. screenshot attached"),
    ("letter to a council", "to whom it may concern, I am writing about the streetlight outside number 52 Brook Street which is broken since over a month. the street is very dark at night and there is many people walking there from the station. last week an older lady fall on the pavement. please can you repair it soon. yours, Helena Brandt"),
    ("thank-you note", "hi Mrs Pereira, thank you so much for the lovely flowers and the card you sent when i was in hospital. it really made my week. im home now and feeling much better, the doctor says i can go back to work in 2 weeks. hope to see you at the garden club soon! love, Birgit"),
    ("announcement for parents", "reminder: school photos are next thursday!! kids should wear their school jumper. siblings photos are in the morning from 8:15 in the hall, you need to book a slot online before tuesday. if your child is absent that day there will be a catch up day in march. any questions ask the office"),
    ("online listing", "selling my kids bike, 20 inch wheels, red, good condition only some scratches. gears work fine, new tyres last summer. he grew out of it. 60 pounds or best offer. pick up only from Ashford, cant deliver. message me if interested, can send more pics"),
    ("message to a hotel", "hi, we have a booking for 2 nights from the 18th, name Okafor. we will arrive very late maybe midnight because our flight lands at 10:40pm. is the reception open then or how do we get the key? also is it possible to have a cot for our baby in the room? thank you"),
    ("note for a house sitter", "thanks for looking after the place!! feed Pepper (the dog) twice a day, one scoop in the morning and one in the evening, NOT more even if she begs lol. water the tomatoes in the greenhouse every evening if it doesnt rain. bins go out wednesday night. wifi password is on the fridge. vet number is also there just in case"),
    ("paragraph from a report", "In 2023 the number of visitors to the museum growed by 18 percent compared to the year before, mostly because of the dinosaur exhibition which was open from may to september. Online ticket sales was 64 percent of all sales, much more than the 40 percent in 2022. However the café made less money because it was closed for renovation during two month."),
    ("message to a group of parents", "hey everyone, for the end of year party for the class we thought about a picnic in Ruskin park on the 20th of july from 2pm. everyone bring some food to share and we collect 3 pounds per family for a present for Miss Adebayo. if it rains we go to the community hall instead. can someone bring a speaker?"),
]

REWRITE_MESSY_TASKS = [
    "Fix the spelling, grammar and punctuation in this {kind}. Keep the meaning and the tone, and return only the corrected text.",
    "Rewrite this {kind} so it sounds polite and professional. Keep every fact (names, dates, times, numbers).",
    "Make this {kind} clearer and more concise without losing any details.",
    "Rewrite this {kind} in a warm, friendly tone, fixing any mistakes along the way.",
    "Turn this {kind} into a short, well-structured message with a greeting, the main points as bullet points, and a sign-off.",
    "Correct the errors in this {kind}, then list each change you made and why.",
]

REWRITE_PASSAGE_TASKS = [
    "Rewrite the following {kind} in simple English for a ten-year-old, keeping all the key facts.",
    "Translate the following {kind} into German.",
    "Translate the following {kind} into Spanish, keeping the sentences clear and natural.",
    "Translate the first paragraph of the following {kind} into French.",
    "Rewrite the following {kind} as a bullet-point list of its facts, in the same order.",
    "Rewrite the following {kind} in a more formal style suitable for an official report.",
    "Rewrite the following {kind} in the first person, as if told by someone involved.",
    "Turn the following {kind} into a short FAQ with four or five questions and answers, using its wording where possible.",
    "Shorten the following {kind} to about half its length while keeping the important details.",
]


# ---------------------------------------------------------------------------------------------
# multi_turn: (first user turn, assistant reply, follow-up, assistant reply, second follow-up,
#              alternative follow-up to the first reply)
# ---------------------------------------------------------------------------------------------

CONVERSATIONS = [
    ("I just got a sourdough-loving friend's old stand mixer. What else can I make with it besides bread?",
     "Plenty! A stand mixer is great for whipped cream and meringues, cake batters, cookie dough, mashed potatoes, and even shredding cooked chicken with the paddle attachment. If it came with a dough hook, pizza dough and soft dinner rolls are easy wins.",
     "Meringues sound fun. Why do mine always end up sticky and weepy?",
     "Sticky meringues usually mean the sugar didn't fully dissolve or they absorbed moisture. Add the sugar slowly, a spoonful at a time, and whisk until the mixture feels smooth between your fingers. Bake low and slow, around 100°C, then leave them in the switched-off oven to dry. Humid days make it harder.",
     "It's raining all week here. Should I wait, or is there a trick for humid weather?",
     "Can I use the mixer to make fresh pasta too, or do I need a separate machine?"),
    ("My 8-year-old wants a pet but we live in a small flat. What would be a good first pet?",
     "For a small flat, good options include a pair of guinea pigs, a couple of rats, or a small fish tank with hardy fish. Rats are surprisingly affectionate and clever, guinea pigs are gentle and chatty, and fish teach routine without much handling. Whatever you choose, an adult should stay in charge of care.",
     "We're leaning toward guinea pigs. How much space do they really need?",
     "More than most pet shop cages offer. Two guinea pigs need at least about 0.7 square meters of floor space, and more is better. Many owners build a C&C cage from grid panels, which is cheap and easy to extend. They also need daily time out of the cage, hay at all times, and fresh vegetables.",
     "What vegetables are safe for them, and which should we avoid?",
     "Why do guinea pigs have to be kept in pairs? Can't we just get one?"),
    ("I'm thinking about switching careers from accounting to UX design. I'm 38. Is that crazy?",
     "Not crazy at all. Many UX designers come from other fields, and accounting gives you useful skills: attention to detail, understanding business processes, and working with stakeholders. The switch usually takes one to two years of learning and building a portfolio, often while still working.",
     "Where should I start? There are so many bootcamps and courses.",
     "Start cheap before committing to an expensive bootcamp. Read a classic introduction to design thinking, take a free or low-cost online course on UX basics, and try a small project, such as redesigning a form you use at work. If you still enjoy it after a couple of months, a structured course with mentorship can help you build a portfolio faster.",
     "What would a good first portfolio project look like for someone with my background?",
     "How do I explain this career change to recruiters without it looking like I'm running away from accounting?"),
    ("We're hosting Thanksgiving-style dinner for 12 people and I've never cooked for that many. Help!",
     "Don't panic: the secret is planning and doing things ahead. Choose a menu where most dishes can be made the day before, like soups, gratins, sauces and desserts. Make a timeline working back from when you want to eat, and ask guests to bring sides or drinks. Keep the main dish simple.",
     "I'm doing a roast turkey. How big does it need to be for 12 people?",
     "Plan on about 500 to 700 grams per person if the turkey is whole with bones, so a bird of roughly 6 to 8 kilograms. That also leaves some leftovers. Make sure it fits in your oven and allow time to thaw it if frozen: in the fridge, that takes about a day for every 2 kilograms.",
     "My oven is pretty small. Would cooking it in pieces work better?",
     "Two of the guests are vegetarian. What's a main dish that feels just as festive?"),
    ("Can you help me understand how to read a nutrition label? I never know what to look at.",
     "Sure. Start with the serving size, since every number on the label refers to it, and packages often contain several servings. Then look at calories, and at the nutrients to limit: saturated fat, salt, and added sugars. Finally check fiber and protein, which most people benefit from getting more of. The percent daily values tell you if an amount is low or high.",
     "What counts as low or high for the percent daily value?",
     "A common rule of thumb is that 5 percent or less of the daily value per serving is low, and 20 percent or more is high. So you want sodium and saturated fat closer to 5 percent, and fiber, vitamins and minerals closer to 20 percent.",
     "My favorite granola says 'no added sugar' but still has 15 grams of sugar. How is that possible?",
     "Is there any difference between 'light' and 'low fat' on packaging?"),
    ("I want to get into birdwatching. What gear do I need to start?",
     "Very little. A pair of binoculars is the main investment; 8x42 is a good all-round choice because it's bright and steady. Add a field guide or a free bird identification app for your region, and a small notebook. Comfortable, quiet clothing in muted colors helps too.",
     "What's the best time of day to see birds?",
     "Early morning, in the first few hours after sunrise, is usually best, because birds are actively feeding and singing. Late afternoon can be good too. In the middle of the day, especially in summer, many birds are quieter and harder to find.",
     "I keep hearing birds but I can't see them. How can I learn bird songs?",
     "Are there any birdwatching spots that are good in a big city?"),
    ("I've been asked to give a best-man speech at my brother's wedding. I hate public speaking. Where do I even begin?",
     "Begin by collecting material: a few short stories about your brother, something you admire about him, and how he met his partner. Then aim for a simple structure: a quick introduction, one or two warm and funny stories, a few kind words about the couple, and a toast. Three to five minutes is plenty.",
     "How do I keep from shaking and forgetting everything when I'm up there?",
     "Practice out loud many times, ideally in front of a friend, until the story flows naturally. Keep short notes on cards rather than a full script. Before you speak, take a few slow breaths and hold something, like your notes or a glass, to steady your hands. The audience is on your side; they want you to succeed.",
     "Is it okay to include a slightly embarrassing story, or is that risky with grandparents there?",
     "Can you help me write an opening line that's funny but not cheesy?"),
    ("My laptop has become really slow over the past year. What can I do before buying a new one?",
     "Quite a lot. First check which programs start automatically and disable the ones you don't need. Uninstall software you never use, and make sure your storage isn't nearly full, since less than 10 to 15 percent free space slows things down. Run the system updates and a malware scan. If it still has a hard disk rather than an SSD, swapping in an SSD is often the biggest single upgrade.",
     "How do I know if it has a hard disk or an SSD?",
     "On Windows, open Task Manager, go to the Performance tab and click your disk; it will say SSD or HDD. On a Mac, open System Information and look under Storage for the medium type. If the laptop is more than about eight years old and was inexpensive, there's a good chance it has a hard disk.",
     "It's an HDD. Is replacing it something I can do myself?",
     "Would adding more RAM help too, or is the disk the main problem?"),
    ("I'm going to Iceland in February. What should I pack?",
     "Layers are essential. Pack thermal base layers, a fleece or wool mid layer, and a waterproof, windproof outer jacket and trousers. Bring a warm hat, gloves, a buff, wool socks and waterproof boots with good grip; microspikes help on icy paths. A swimsuit is a must for the hot pools.",
     "What are the chances of seeing the northern lights in February?",
     "February is a good month because the nights are long. You need a clear sky and some solar activity, so it's never guaranteed, but with a few nights outside the city, your chances are reasonable. Check the aurora and cloud forecasts daily and be ready to head out late in the evening.",
     "We won't have a car. Is it better to join a tour or try to see them from Reykjavik?",
     "Is it safe to drive around the Ring Road in winter as a beginner?"),
    ("I keep procrastinating on my thesis. I have three months left. How can I get back on track?",
     "Three months is workable. Start by breaking the thesis into concrete chunks, like 'write methods section' or 'make figures for chapter 3', and put them on a calendar with deadlines. Work in focused blocks, for example 50 minutes on and 10 off, and start each day with the task you're avoiding. Tell your supervisor your plan so you have some accountability.",
     "The hardest part is starting to write. I stare at the blank page for ages.",
     "Try lowering the bar: write a messy 'zero draft' that nobody will see, with notes to yourself and placeholders. Or start by writing bullet points for each paragraph, then turn them into sentences. It's much easier to edit bad text than to create perfect text from nothing.",
     "What if my supervisor is slow to give feedback? That's holding me up too.",
     "How many hours a day of writing is realistic without burning out?"),
    ("What's a good way to start investing if I only have about 100 dollars a month to spare?",
     "A simple option is a low-cost, broadly diversified index fund, bought automatically every month. Before investing, it's wise to have an emergency fund of a few months of expenses and to pay off high-interest debt. Look for accounts with low fees, since fees matter a lot on small amounts.",
     "What's the difference between an index fund and a normal fund?",
     "An index fund simply tries to copy a market index, like a list of the largest companies, so it needs little management and usually has very low fees. An actively managed fund has managers who pick investments to try to beat the market; it charges more, and most such funds don't beat their index over the long run after fees.",
     "If the market crashes right after I start, should I stop buying?",
     "Should I worry about currency risk if the fund invests in other countries?"),
    ("I'm learning to knit. I finished a scarf! What should I try next?",
     "Congratulations! A good next step is a hat knit in the round on circular needles, which teaches you a new technique and shaping with decreases. Other nice second projects are a dishcloth with a simple texture pattern, or fingerless mittens, which introduce knitting in the round on a small scale.",
     "Circular needles look confusing. How do I avoid twisting the stitches when I join?",
     "After casting on, lay the needles on a table and make sure the bumpy edge of the cast-on faces inward all the way around, with no spirals. Only then join by knitting the first stitch from the left needle. Some knitters knit one or two rows flat before joining, and sew the small gap closed later.",
     "My hat turned out way too big. What went wrong?",
     "What kind of yarn is easiest to work with for a beginner's hat?"),
    ("My elderly father keeps getting scam phone calls. How can I protect him?",
     "Start by talking with him about common scams: callers claiming to be from his bank, the police, tech support or a relative in trouble. Agree on a simple rule that he never gives out codes, passwords or payments on a call he didn't make, and that he can always hang up and call back using a number he trusts. Call-blocking features from his phone provider can also cut down the calls.",
     "He's very polite and finds it hard to hang up on people. Any tips?",
     "Give him a short script he can use, like 'I don't deal with this on the phone. Goodbye.' Practice it with him so it feels natural. Remind him that real banks and officials expect people to hang up and check. A note next to the phone with the script and your number can help too.",
     "What should we do if he's already given his bank details to someone?",
     "Are there phones designed for older people that block unknown numbers?"),
    ("I'd like to start composting in my backyard. How do I start?",
     "Choose a shady or partly shaded spot on bare soil and use a bin or simple enclosure. Add a mix of 'greens', like fruit and vegetable scraps, coffee grounds and fresh grass, and 'browns', like dry leaves, shredded cardboard and straw. Aim for roughly two to three parts browns to one part greens, keep it as damp as a wrung-out sponge, and turn it every few weeks.",
     "It smells bad already after two weeks. What did I do wrong?",
     "A bad smell usually means too many greens and not enough air. Mix in a generous amount of dry browns, such as shredded cardboard or leaves, and turn the pile to let oxygen in. Avoid adding meat, dairy and oily food, which rot and attract pests.",
     "How do I know when the compost is ready to use?",
     "Can I compost in winter when it's freezing?"),
    ("Can you explain what a VPN is and whether I actually need one?",
     "A VPN creates an encrypted tunnel between your device and a server run by the VPN provider. Websites then see the provider's address instead of yours, and people on your local network, like on public Wi-Fi, can't see what you're doing. It's useful on untrusted networks or to access services from another country, but it doesn't make you anonymous, and you have to trust the provider.",
     "Is it worth it just for using café Wi-Fi?",
     "Less than it used to be. Most websites now use HTTPS, which already encrypts your connection, so someone on café Wi-Fi can see which sites you visit but not what you do on them. A VPN adds extra protection, and it's a reasonable choice if you often use public networks, but it isn't essential for most people.",
     "Are free VPNs safe to use?",
     "Will a VPN slow down my internet a lot?"),
    ("I'm going to paint my living room for the first time. What do I need to know?",
     "Preparation is most of the work. Move furniture away, cover the floor, wash greasy marks off the walls, fill holes and sand them smooth. Use painter's tape on edges you can't cut in by hand. Prime any patches and stains, then apply two thin coats of paint rather than one thick one, letting the first dry fully.",
     "Should I use matte or satin paint?",
     "Matte paint hides wall imperfections well and looks soft, but it marks more easily. Satin or eggshell has a slight sheen and is easier to wipe clean, so it's better for busy rooms or if you have children, though it shows bumps and patches more. Many people use matte for ceilings and eggshell for living room walls.",
     "How do I get a clean line between the wall and the ceiling?",
     "How much paint will I need for a room about 4 by 5 meters?"),
    ("I want to learn to cook Indian food at home. Where should I start?",
     "Start with a few versatile dishes: a simple dal, a chana masala, and a vegetable curry. Build a small spice collection: cumin seeds, ground coriander, turmeric, chili powder, garam masala and mustard seeds. Learn the basic method of cooking onions slowly, then adding ginger, garlic and spices before tomatoes. That base covers many recipes.",
     "My dal always tastes flat compared to restaurant dal. What's missing?",
     "Probably the tadka, or tempering. At the end, heat ghee or oil, fry cumin seeds, a dried chili, garlic slices and a pinch of asafoetida until fragrant, then pour it over the dal. Also check salt and add a squeeze of lemon; a bit of acid brightens it a lot. Restaurants also tend to use more fat than home cooks.",
     "What's asafoetida and is there a substitute if I can't find it?",
     "Can I make a batch of curry on Sunday and eat it all week?"),
    ("I'm a new manager of a team of five. What are the most important things to get right in the first month?",
     "Focus on listening. Have one-on-one meetings with each person to learn what they work on, what frustrates them and what they want to grow in. Clarify expectations with your own manager. Avoid big changes in the first weeks; understand why things work the way they do first. Set up a regular rhythm of one-on-ones and a short team meeting.",
     "One of my team members was also up for the manager job. It feels awkward. How should I handle it?",
     "Address it directly but kindly in a private conversation. Acknowledge that it may be disappointing, say that you value their experience, and ask what they'd like to work on. Giving them real responsibility, like leading a project, shows respect. Then treat them fairly and consistently; the awkwardness usually fades when they see you're on their side.",
     "How do I give critical feedback without demotivating someone?",
     "How often should I hold one-on-ones?"),
    ("My teenager wants a smartphone. She's 12. What rules make sense?",
     "Many families do well with a written agreement that you make together. Common points are: phones charge outside the bedroom at night, no phones at meals, an agreed daily limit on social apps, and parents know the passcode. Explain that the rules will loosen as she shows responsibility. Talk about online safety: strangers, sharing photos, and what to do if something upsets her.",
     "She says all her friends have no rules. How do I respond to that?",
     "Acknowledge that it feels unfair, but explain that your family makes its own decisions. Often 'everyone' is an exaggeration; it can help to talk with other parents, since many share the same worries. Offer a clear path to more freedom, like reviewing the rules every few months.",
     "Which parental control settings are actually useful?",
     "What signs would suggest she's spending too much time on it?"),
    ("I want to build a simple website for my pottery business. Should I use a website builder or hire someone?",
     "For a small business starting out, a website builder is usually the best choice: it's cheap, fast, and you can update it yourself. Many include online shop features. Hiring a developer makes more sense if you need something unusual or have a larger budget. You can always start with a builder and upgrade later.",
     "What pages should the site have?",
     "Keep it simple: a home page with great photos and a short introduction, a shop or gallery page, an 'About' page telling your story and showing your studio, a page with upcoming markets or workshops, and a contact page. Good photos are the most important part for pottery, so invest time in lighting.",
     "How do I take good photos of pottery without a professional setup?",
     "How should I price shipping for fragile items?"),
    ("I feel stiff after sitting at a desk all day. Any stretches I can do at work?",
     "Yes, several can be done at your desk. Try slow neck tilts, shoulder rolls, a seated spinal twist holding the back of your chair, a chest stretch with hands clasped behind you, and a seated figure-four stretch for the hips. Hold each for 20 to 30 seconds, breathe normally, and stop if anything hurts. Getting up to walk for a couple of minutes every half hour helps even more.",
     "How can I remember to take breaks? I get absorbed in work.",
     "Link breaks to something that already happens: stand up after each call, or every time you refill your water. A timer or a break reminder app can help too, set to every 30 to 45 minutes. Drinking more water also naturally gets you up.",
     "Would a standing desk solve the problem?",
     "My lower back hurts most. Is my chair the problem?"),
    ("We want to go camping with our two kids for the first time. Any advice?",
     "Start small: one or two nights at a campsite with toilets and running water, not too far from home. Practice putting up the tent in your garden or a park first. Bring warm layers for the night, since it gets colder than you expect, plus headlamps for everyone, easy meals and a few games. Let the kids help with jobs so they feel involved.",
     "What food is easy to cook on a small camping stove?",
     "One-pot meals work best: pasta with a ready-made sauce, couscous with vegetables, instant noodles with eggs, or sausages and beans. Breakfast can be porridge or pancakes from a shaker bottle. Pre-chop vegetables at home and keep things in labelled bags. Bring snacks the kids love, plus marshmallows if fires are allowed.",
     "What if it rains the whole weekend?",
     "How do I keep the kids warm enough at night?"),
    ("I'm writing my first short story for a competition. How do I make the opening grab the reader?",
     "Start as close to the action or tension as possible, rather than with background or weather. Introduce a character who wants something, and hint at a problem in the first few lines. A specific, surprising detail is more memorable than a general description. You can explain the background later, bit by bit.",
     "My story is about a woman returning to her hometown after twenty years. How could that start?",
     "You could open at the moment something has changed or gone wrong: her key still fitting the lock of a house that isn't hers anymore, or someone at the station recognising her before she recognises them. Starting with a small, charged moment lets you reveal her history gradually.",
     "How long should the story be for a competition with a 3,000-word limit?",
     "How do I write dialogue that doesn't sound stiff?"),
    ("I'm trying to save money on groceries. We're a family of four. Where can I cut costs?",
     "Plan meals for the week around what's on offer and what you already have, then shop with a list. Cook in batches and freeze portions. Buy store brands, loose vegetables, and staples like rice, oats and pulses in bulk. Use leftovers deliberately, like a 'clear out the fridge' night. Cutting down on ready meals and snacks usually saves the most.",
     "My kids are picky eaters. How do I stop wasting food they refuse?",
     "Serve smaller portions with the option of seconds, and include at least one food they usually eat at each meal. Let them serve themselves when possible. Keep offering new foods in small amounts without pressure; it can take many tries. Leftovers can become next day's lunch, soup, or a topping for pasta.",
     "What are some cheap meals that most kids like?",
     "Is it really cheaper to buy in bulk, or is that a myth?"),
    ("I'd like to learn basic photography with my new camera instead of using auto mode. What should I learn first?",
     "Learn the exposure triangle: aperture, shutter speed and ISO. Aperture controls how much of the scene is sharp from front to back, shutter speed controls motion blur, and ISO controls sensitivity to light, with more noise at high values. Start in aperture priority mode, where you choose the aperture and the camera handles the rest.",
     "What aperture should I use for portraits with a blurry background?",
     "Use a wide aperture, meaning a small f-number such as f/1.8 to f/4, depending on your lens. Keep some distance between your subject and the background, and zoom in or stand closer, since a longer focal length also blurs the background more. Focus on the eye nearest to the camera.",
     "My indoor photos are always blurry. What's causing that?",
     "Is it worth shooting in RAW instead of JPEG?"),
    ("My team wants to start using Git, but most of them have never used version control. How should I introduce it?",
     "Keep the first steps small. Explain the basic idea: Git saves snapshots of a project so you can see history and undo mistakes. Teach a tiny workflow first: clone, edit, add, commit, pull, push. Use a shared hosting service with a simple graphical interface, and do a hands-on session with a practice repository where mistakes don't matter.",
     "Should we use branches right away or keep everyone on main?",
     "Introduce simple branches early, because they make collaboration safer: each change gets a short-lived branch and is merged through a pull request that someone reviews. Avoid complicated branching models at first; one main branch plus feature branches is enough for most small teams.",
     "What should we do when two people get a merge conflict?",
     "What should we put in a .gitignore file?"),
    ("I'm considering adopting a retired racing greyhound. What should I know?",
     "Retired greyhounds are often calm, gentle and surprisingly lazy; many sleep most of the day. They usually need two walks a day and a chance to run in a safely fenced area. Because they've lived in kennels, things like stairs, glass doors and being alone may be new to them. Many have a strong chase instinct, so they often need to stay on a lead in open spaces.",
     "We have a small cat. Is that a problem?",
     "It can be, but not always. Adoption groups often test greyhounds with cats and label them 'cat-safe' or not. If you have a cat, ask specifically for a cat-tested dog, introduce them slowly with the dog muzzled and on a lead, and never leave them alone together until you're very confident.",
     "How long does it usually take for a greyhound to settle in?",
     "Do greyhounds need coats in winter?"),
    ("I'm starting university next month and I'm nervous about making friends. Any advice?",
     "It's very common to feel that way, and most first-year students feel the same. Go to as many welcome events as you can in the first weeks, when everyone is open to meeting people. Join one or two clubs that meet regularly, since repeated contact builds friendships. Keep your door open in halls and suggest simple plans, like getting lunch after a lecture.",
     "I'm quite introverted. Big parties drain me.",
     "That's fine; you don't need parties. Smaller settings often work better for introverts: a club with a shared activity, a study group, a volunteering project or a board game night. One-to-one coffee is a great way to turn an acquaintance into a friend. Give yourself quiet time to recharge without feeling guilty.",
     "What if I still feel lonely after a couple of months?",
     "How do I balance social life with actually studying?"),
    ("What's the easiest way to start a vegetable garden if I've never grown anything?",
     "Start small with a raised bed or a few large containers in the sunniest spot you have, ideally six or more hours of sun. Choose easy crops: lettuce, radishes, bush beans, courgettes and herbs like parsley. Use good compost-rich soil, water deeply a few times a week rather than a little every day, and mulch to keep moisture in.",
     "Slugs ate all my lettuce seedlings overnight. How do I stop them?",
     "Go out with a torch after dark and pick them off; it's surprisingly effective. Beer traps sunk in the soil, copper tape around containers, and barriers of crushed eggshells help a bit. Encourage predators like birds, frogs and beetles. Growing seedlings a bit bigger indoors before planting out also makes them tougher.",
     "When can I harvest the radishes?",
     "Which herbs can I grow on a windowsill in winter?"),
    ("My car is making a squealing noise when I brake. Should I be worried?",
     "Squealing when braking is often caused by the wear indicators on the brake pads, small metal tabs designed to squeal when the pads are getting thin. It can also come from dust, moisture or glazed pads. It's not usually an emergency, but get the brakes checked soon. If you hear grinding or the car pulls to one side, stop driving and have it checked right away.",
     "How much does it usually cost to replace brake pads?",
     "It varies by car and region, but front brake pads are one of the cheaper brake jobs, usually a moderate cost including labour. If the discs are also worn, replacing them adds to the price. Ask for a quote that lists parts and labour separately, and compare a couple of garages.",
     "Can I replace brake pads myself with basic tools?",
     "The noise only happens on cold, damp mornings. Does that change anything?"),
    ("I'd like to start meditating but I can't sit still for long. Any tips?",
     "Start with just two to five minutes a day. Sit comfortably, close your eyes or look down, and pay attention to your breathing. When your mind wanders, which it will, simply notice it and come back to the breath; that returning is the practice. A guided recording can help at first. Doing it at the same time each day builds the habit.",
     "Is walking meditation a real thing? Sitting makes me restless.",
     "Yes, it's a traditional practice. Walk slowly, in a quiet place, paying attention to the sensations of each step: lifting, moving and placing the foot. When your mind wanders, bring it back to your feet. Even ten minutes of slow walking can be calming.",
     "How long before I notice any effect?",
     "Can meditation help me fall asleep faster?"),
    ("I'm organising a book club with friends. How do we choose books everyone will like?",
     "You won't always please everyone, and that's part of the fun. Common approaches are to rotate who picks, or have each person suggest two books and vote. Agree on some limits, like length or price, and mix genres over the year. Shorter books help when everyone is busy.",
     "How do we keep the discussion going instead of just chatting about our week?",
     "Have the host prepare four or five open questions, like what surprised people, which character they'd want to meet, or whether the ending worked. Start with a quick round where everyone gives the book a score and one sentence why. Leave time for chatting afterwards, so it doesn't compete with the discussion.",
     "What should we do about members who often don't finish the book?",
     "Can you suggest five novels that usually spark good discussions?"),
    ("I'm planning to run a half marathon next spring. I currently run 5 km three times a week. How should I train?",
     "You have a good base. Build up gradually over about 12 to 16 weeks: keep three or four runs a week, make one of them a long run that grows by about 1 to 2 km each week, and keep most running at an easy, conversational pace. Add one session of faster running, like intervals, once a week. Every third or fourth week, cut back to recover.",
     "My knees hurt a bit after the long runs. Is that normal?",
     "Mild soreness that goes away in a day can be normal when increasing distance, but pain that lingers, gets worse, or changes how you run is a warning sign. Check your shoes, which wear out after roughly 600 to 800 km, and don't increase distance too fast. Strength exercises for hips and thighs help. If pain persists, see a physiotherapist.",
     "What should I eat before and during the race?",
     "How do I pace myself on race day?"),
]

MULTI_TURN_RECAPS = [
    "Thanks, this is really helpful. Could you put everything you've told me so far into a short checklist?",
    "Great. Can you summarise your advice from this conversation in three or four bullet points?",
    "Thanks! Could you turn all of that into a simple step-by-step plan for the next two weeks?",
]

# ---------------------------------------------------------------------------------------------
# instruction templates for the passage-based categories
# ---------------------------------------------------------------------------------------------

SUMMARY_TASKS = [
    "Summarize the following {kind} in {n} sentences.",
    "Give me a {n}-bullet summary of this {kind}.",
    "Write a one-paragraph summary of this {kind} for a busy reader.",
    "What are the main points of this {kind}? Answer with {n} bullet points.",
    "Summarize this {kind} in one sentence, then list the key facts underneath.",
    "Write a headline and a two-sentence summary for this {kind}.",
    "Summarize the {kind} below so that a ten-year-old could understand it.",
    "Pick out the key names, dates and numbers from this {kind}, then summarize it in two sentences.",
    "In no more than 60 words, what is this {kind} about?",
    "Summarize this {kind} for a colleague who has not read it, keeping the most important details.",
]
SUMMARY_PARAGRAPH_TASKS = [
    "Summarize this paragraph in a single sentence.",
    "What is the main point of this paragraph? Answer briefly.",
    "Condense this paragraph into one short sentence that keeps the key facts.",
]

RAG_INSTRUCTIONS = [
    "Answer only from the documents and quote the sentence or sentences you rely on.",
    "Use only the documents above. After each fact in your answer, say which document it comes from.",
    "Base your answer strictly on the documents. If they do not contain the answer, say that clearly.",
    "First quote the relevant text word for word, then answer in one or two sentences.",
    "Answer using the documents only, and include a short quotation as evidence for each point.",
    "Reply with a brief answer grounded in the documents, citing them as [Doc n].",
]
RAG_UNANSWERABLE = [
    "What is the phone number of the organisation mentioned?",
    "Who was the mayor of the town at the time?",
    "What was the weather like on the day this happened?",
    "What is the website address where I can find more information?",
    "What did the newspaper's editor think about this?",
]


# ---------------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------------


def _paragraphs(text: str) -> list:
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def _build_qa(rng: random.Random) -> list:
    return [[user(q + rng.choice(QA_SUFFIXES))] for q in QA_QUESTIONS]


def _build_math(rng: random.Random) -> list:
    out, seen = [], set()
    k = 0
    while len(out) < PER_CATEGORY:
        text = MATH_TEMPLATES[k % len(MATH_TEMPLATES)](rng) + rng.choice(MATH_SHOW)
        k += 1
        if text not in seen:
            seen.add(text)
            out.append([user(text)])
    return out


def _code_block(lang: str, code: str) -> str:
    return f"```{lang}\n{code}\n```"


def _build_code(rng: random.Random) -> list:
    out = []
    for i, (lang, intro, code) in enumerate(CODE_SNIPPETS):
        tasks = SQL_EDIT_TASKS if lang == "sql" else CODE_EDIT_TASKS
        picks = rng.sample(tasks, 3 if i % 2 == 0 else 2)
        for j, task in enumerate(picks):
            layout = (i + j) % 3
            if layout == 0:
                text = f"Here is {intro}:\n\n{_code_block(lang, code)}\n\n{task}"
            elif layout == 1:
                text = f"{task}\n\n{_code_block(lang, code)}"
            else:
                text = f"I'm working on {intro}.\n\n{_code_block(lang, code)}\n\n{task}"
            out.append([user(text)])
    out += [[user(t)] for t in CODE_SCRATCH]
    return out


def _build_summarization(rng: random.Random) -> list:
    out = []
    for i, (kind, _title, text, _qs) in enumerate(PASSAGES):
        for j, task in enumerate(rng.sample(SUMMARY_TASKS, 2)):
            instr = task.format(kind=kind, n=rng.choice([2, 3, 4, 5]))
            text_prompt = f"{text}\n\n{instr}" if (i + j) % 2 else f"{instr}\n\n{text}"
            out.append([user(text_prompt)])
        if i % 2 == 0:  # short inputs too: a single paragraph
            para = rng.choice(_paragraphs(text))
            out.append([user(f"{rng.choice(SUMMARY_PARAGRAPH_TASKS)}\n\n{para}")])
    return out


def _docs_prompt(rng: random.Random, docs: list, question: str) -> str:
    body = "\n\n".join(f"[Doc {k}] {d}" for k, d in enumerate(docs, 1))
    return f"{body}\n\nQuestion: {question}\n{rng.choice(RAG_INSTRUCTIONS)}"


def _passage_docs(passage) -> list:
    _kind, title, text, _qs = passage
    paras = _paragraphs(text)
    return [f"{title}{'' if n == 0 else ' (continued)'}. {p}" for n, p in enumerate(paras)]


def _build_rag(rng: random.Random) -> list:
    out = []
    for i, passage in enumerate(PASSAGES):
        own = _passage_docs(passage)
        for question in passage[3]:
            others = [p for k, p in enumerate(PASSAGES) if k != i]
            distractors = [rng.choice(_passage_docs(p)) for p in rng.sample(others, rng.randint(0, 2))]
            docs = own + distractors
            rng.shuffle(docs)
            out.append([user(_docs_prompt(rng, docs, question))])
    for question in RAG_UNANSWERABLE:  # the documents do not hold the answer
        docs = [rng.choice(_passage_docs(p)) for p in rng.sample(PASSAGES, 3)]
        out.append([user(_docs_prompt(rng, docs, question))])
    return out


def _build_rewrite(rng: random.Random) -> list:
    out = []
    for kind, text in MESSY_TEXTS:
        for task in rng.sample(REWRITE_MESSY_TASKS, 2):
            out.append([user(f"{task.format(kind=kind)}\n\n{text}")])
    for i, (kind, _title, text, _qs) in enumerate(PASSAGES):
        task = REWRITE_PASSAGE_TASKS[i % len(REWRITE_PASSAGE_TASKS)]
        if "Translate" in task:  # keep translations short: one paragraph
            task, text = task.replace("the first paragraph of ", "").format(kind="paragraph"), _paragraphs(text)[0]
        else:
            task = task.format(kind=kind)
        out.append([user(f"{task}\n\n{text}")])
    return out


def _build_multi_turn(rng: random.Random) -> list:
    out = []
    for i, (u1, a1, u2, a2, u3, alt) in enumerate(CONVERSATIONS):
        out.append([user(u1), assistant(a1), user(u2)])
        out.append([user(u1), assistant(a1), user(u2), assistant(a2), user(u3)])
        out.append([user(u1), assistant(a1), user(alt)])
        if i % 3 == 0:  # a follow-up that asks to reuse the earlier answers
            out.append([user(u1), assistant(a1), user(u2), assistant(a2), user(rng.choice(MULTI_TURN_RECAPS))])
    return out


BUILDERS = {"multi_turn": _build_multi_turn, "code": _build_code, "summarization": _build_summarization,
            "rag_qa": _build_rag, "qa": _build_qa, "math": _build_math, "rewrite": _build_rewrite}


def build() -> dict:
    """Compose all prompts; same output on every run (one RNG per category, seeded from SEED)."""
    categories = {}
    for c_idx, name in enumerate(CATEGORIES):
        rng = random.Random(SEED * 100 + c_idx)
        chats = BUILDERS[name](rng)
        assert len({json.dumps(c) for c in chats}) == len(chats), f"duplicate prompts in {name}"
        rng.shuffle(chats)  # mix prompt types so any prefix (per_category=N) is varied
        categories[name] = [{"id": f"train-{name}-{k:03d}", "messages": m} for k, m in enumerate(chats, 1)]
    return {
        "version": 1,
        "description": ("Original training prompts for self-distilling speculative-decoding drafters (draft "
                        "model, early-exit adapter, Medusa heads, EAGLE), in the benchmark's seven workload "
                        "categories but disjoint from workloads.json. Generated by make_train_prompts.py."),
        "categories": categories,
    }


def render(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render(build())
    if "--check" in argv:
        current = OUT_PATH.read_text(encoding="utf-8") if OUT_PATH.exists() else None
        if current != text:
            print(f"{OUT_PATH} is stale; rerun without --check")
            return 1
        print(f"{OUT_PATH} is up to date")
        return 0
    OUT_PATH.write_text(text, encoding="utf-8")
    counts = {k: len(v) for k, v in json.loads(text)["categories"].items()}
    print(f"wrote {OUT_PATH}: {sum(counts.values())} prompts {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
